"""End-to-end benchmark over gRPC: the three services as real processes, clients in their own.

    python -m bench.e2e_bench [--quick] [--runs N] [--flush sync|async|both] [--dir DIR]
                              [--doc PATH | --no-doc] [--samples-dir DIR]

For each flush mode (sync, then async): first commitlog_svc alone (no subscribers), for the
produce reference; then a fresh store of commitlog_svc with `--flush`, one cq_svc and one
index_svc following it (mqstore.testing.cluster.Cluster, ports 0, data in a temporary
directory, logs to files there), each with its default settings, as `make run` starts them.
Every service is stopped with SIGTERM at the end, whatever happened. The clients run in the
worker processes of a spawn-based pool, never in a service's or the orchestrator's process.

What is measured, per flush mode, in this order:
- produce: columnar batches (one topic, 1,000 messages a batch, queue ids over 8 queues, bodies
  of 100 B and 1 KiB, properties holding a UNIQ_KEY made by the producer), built before the
  clock starts, sent with unary Append (UNARY_IN_FLIGHT calls in flight through futures) and
  with AppendStream (STREAM_WINDOW requests in flight). msg/s, median (min-max) of --runs runs,
  the runs of every variant interleaved, each run starting with the followers caught up; next
  to the same with the commit log alone, measured just before (the cost of dispatch shows).
- consume by offset: every queue of a produced topic pulled from offset 0 with max_messages
  1,000 to its end, each record decoded as a consumer must (read_record with its CRC check,
  then the properties map); one Pull in flight, and one per queue (8 threads).
- peak load and dispatch lag: AppendStream of 100 B batches at full speed for a while, the
  orchestrator sampling every SAMPLE_INTERVAL_S the commit log's GetStatus (each subscriber's
  lag_bytes / lag_ms, measured to its *confirmed* offset: applied, flushed and reported) and
  each follower's GetStatus (applied_offset: what a Pull or a query can already see). Reported:
  the rate sustained; per follower the max and final (when the producer stops) of both lags;
  whether the applied lag is bounded (its least-squares slope over the second half of the
  phase, against the write rate); how long the followers take to apply everything after.
- append-to-visible: 8 consumer threads long-poll (Pull with long_poll_ms) at the end of the 8
  queues of a fresh topic while a producer sends unary Append batches of 100 B paced at half,
  and then a quarter, of the rate the peak-load phase sustained. Each body starts with
  time.time_ns() read just before its Append; a message's latency is its arrival at the
  consumer minus that (both clients on this machine, one clock). p50 / p99 / max over every
  message, and the p50 of the first and last fifth sent: a load the system cannot sustain
  shows as latency growing through the run (flagged SATURATED).
- time lookup: GetOffsetByTime at random timestamps within the peak phase's topic (LOWER and
  UPPER alternately), interleaved with the bare round trips it is to be read against:
  GetQueueInfo on the same server and channel, and the health Check on the health port.

CPU: for every phase, the cores used by the client process(es), each service, and everything
else on the machine (from /proc: total busy time minus ours), so that a saturated process shows
at ~1.0 and "other" flags a noisy neighbour. The meter starts when the client is connected with
its requests built (Gate), so it covers the measured window.

The machine is a shared 2-core VM: clients and the three services share those 2 cores, so the
figures are whole-system ones, and only ratios within one run mean much. The markdown table
goes into --doc (default docs/bench.md, between the DOC_BEGIN / DOC_END markers; not with
--quick unless --doc is given); the prose around it is kept.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import __version__ as protobuf_version
from google.protobuf.internal import api_implementation
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mqstore.formats.msgid import UniqIdGenerator
from mqstore.formats.properties import decode_properties, encode_properties
from mqstore.formats.record import Record, read_record
from mqstore.formats.record_columns import split_records
from mqstore.launcher import ServiceProcess
from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc
from mqstore.rpc.gen.common.v1 import common_pb2
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc as cq_grpc
from mqstore.rpc.gen.index.v1 import index_pb2 as ix
from mqstore.rpc.gen.index.v1 import index_pb2_grpc as ix_grpc
from mqstore.testing.cluster import Cluster

BATCH = 1000  # messages per Append request, as the producer SDK batches them
QUEUES = 8
UNARY_IN_FLIGHT = 4  # Append futures outstanding: enough to hide one round trip per call
STREAM_WINDOW = 8  # AppendStream requests outstanding (the server reads up to 16 ahead)
PULL_MAX = 1000  # max_messages per Pull (the server caps at 1,024)
LONG_POLL_MS = 2000
# Append-to-visible load, as shares of the rate the peak-load phase sustained: half (the issue's
# figure) and a quarter, in case half is more than producer and consumers sustain at once.
VISIBLE_SHARES = (0.5, 0.25)
SAMPLE_INTERVAL_S = 0.1
CALL_TIMEOUT_S = 30.0
READY_TIMEOUT_S = 120.0
GATE_TIMEOUT_S = 300.0
CATCH_UP_TIMEOUT_S = 180.0
# Unique UNIQ_KEYs cost ~2 us a message to make: the peak-load phase, which runs for a time
# rather than a count, cycles through this many prebuilt requests instead.
PEAK_POOL_BATCHES = 200
# Disk one store of a full run takes at its largest (measured: ~3 GiB, mostly preallocated
# 1 GiB commit-log segments, 6 MB consume-queue files and the 420 MB index file), with room.
STORE_BYTES_MAX = 6 << 30
DISK_CLEAN_FORCIBLY_RATIO = 0.85  # commitlog_svc's default (RocketMQ's)
BODIES = (100, 1024)
DOC_BEGIN = "<!-- e2e_bench:begin (generated by python -m bench.e2e_bench) -->"
DOC_END = "<!-- e2e_bench:end -->"


@dataclass(frozen=True)
class Scale:
    produce_messages: int  # per produce run
    runs: int
    visible_s: float  # append-to-visible phase
    peak_s: float  # dispatch lag phase
    lookups: int  # of each kind (time lookup, GetQueueInfo, health Check)


FULL = Scale(produce_messages=100_000, runs=3, visible_s=10.0, peak_s=20.0, lookups=2000)
QUICK = Scale(produce_messages=20_000, runs=1, visible_s=2.0, peak_s=3.0, lookups=200)


# =============================================================================================
# Clients: module-level functions run in the worker processes. Each returns plain data and the
# CPU seconds its process used during the measured window.


@dataclass(frozen=True)
class Gate:
    """When the clock starts. A client builds what it sends, connects, then touches `ready`
    and waits for `go`: the orchestrator starts its CPU meter in between, so that the meter
    covers the measured window and not the building."""

    ready: str
    go: str

    def arrive(self) -> None:
        Path(self.ready).touch()
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not os.path.exists(self.go):
            if time.monotonic() > deadline:
                raise TimeoutError("the orchestrator never opened the gate")
            time.sleep(0.001)


def build_requests(topic: str, body_bytes: int, batches: int) -> list[cl.AppendRequest]:
    """Columnar requests as a producer hands them over: each message its own UNIQ_KEY (one
    random body, repeated)."""
    ids = UniqIdGenerator()
    body = os.urandom(body_bytes)
    queue_ids = [i % QUEUES for i in range(BATCH)]
    out = []
    for _ in range(batches):
        props = [encode_properties({"UNIQ_KEY": ids.next_id()}) for _ in range(BATCH)]
        batch = cl.MessageBatch(
            topic=topic, queue_ids=queue_ids, bodies=[body] * BATCH, properties=props
        )
        out.append(cl.AppendRequest(batches=[batch]))
    return out


class _Tally:
    """What a producer learned from its answers."""

    def __init__(self) -> None:
        self.stored = 0
        self.refused = 0
        self.first_store_ms = 0
        self.last_store_ms = 0

    def take(self, response: cl.AppendResponse) -> None:
        ok = list(response.statuses).count(cl.PUT_OK)
        self.stored += ok
        self.refused += len(response.statuses) - ok
        if not self.first_store_ms:
            self.first_store_ms = response.store_timestamp_ms
        self.last_store_ms = response.store_timestamp_ms


def _send_unary(
    stub: cl_grpc.CommitLogStub, requests: Iterator[cl.AppendRequest], tally: _Tally
) -> None:
    pending: deque[Any] = deque()
    for request in requests:
        if len(pending) >= UNARY_IN_FLIGHT:
            tally.take(pending.popleft().result())
        pending.append(stub.Append.future(request, timeout=CALL_TIMEOUT_S))
    while pending:
        tally.take(pending.popleft().result())


def _send_stream(
    stub: cl_grpc.CommitLogStub, requests: Iterator[cl.AppendRequest], tally: _Tally
) -> None:
    window = threading.Semaphore(STREAM_WINDOW)

    def paced() -> Iterator[cl.AppendRequest]:
        for request in requests:
            window.acquire()
            yield request

    for response in stub.AppendStream(paced()):
        window.release()
        tally.take(response)


def produce(
    target: str, topic: str, body_bytes: int, messages: int, method: str, gate: Gate
) -> dict[str, Any]:
    """`messages` messages (whole batches) with `method` ("unary" | "stream")."""
    requests = build_requests(topic, body_bytes, max(1, messages // BATCH))
    send = _send_unary if method == "unary" else _send_stream
    tally = _Tally()
    with make_channel(target) as channel:
        stub = cl_grpc.CommitLogStub(channel)
        grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT_S)
        gate.arrive()
        cpu0, began = time.process_time(), time.perf_counter()
        send(stub, iter(requests), tally)
        took = time.perf_counter() - began
        cpu = time.process_time() - cpu0
    return {
        "stored": tally.stored,
        "refused": tally.refused,
        "seconds": took,
        "client_cpu_s": cpu,
        "first_store_ms": tally.first_store_ms,
        "last_store_ms": tally.last_store_ms,
    }


def produce_for(
    target: str, topic: str, body_bytes: int, seconds: float, gate: Gate
) -> dict[str, Any]:
    """AppendStream at full speed for `seconds`, cycling through prebuilt requests."""
    pool = build_requests(topic, body_bytes, PEAK_POOL_BATCHES)

    tally = _Tally()
    with make_channel(target) as channel:
        stub = cl_grpc.CommitLogStub(channel)
        grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT_S)
        gate.arrive()
        cpu0, began = time.process_time(), time.perf_counter()
        stop_at = began + seconds

        def until_time() -> Iterator[cl.AppendRequest]:
            i = 0
            while time.perf_counter() < stop_at:
                yield pool[i % len(pool)]
                i += 1

        _send_stream(stub, until_time(), tally)
        took = time.perf_counter() - began
        cpu = time.process_time() - cpu0
    return {
        "stored": tally.stored,
        "refused": tally.refused,
        "seconds": took,
        "client_cpu_s": cpu,
        "first_store_ms": tally.first_store_ms,
        "last_store_ms": tally.last_store_ms,
    }


def _decode(raw: bytes) -> tuple[Record, dict[str, str]]:
    """What a consumer does with each record: check and decode it, and its properties."""
    record = read_record(raw, 0, len(raw))
    if not isinstance(record, Record):
        raise RuntimeError(f"undecodable record: {record}")
    return record, decode_properties(record.properties)


def consume(target: str, topic: str, expected: int, threads: int, gate: Gate) -> dict[str, Any]:
    """Pull every queue from offset 0 to its end; queues shared round-robin among `threads`
    (one Pull in flight each); every record decoded."""
    counts = [0] * threads
    body_bytes = [0] * threads
    errors: list[BaseException] = []

    def run(slot: int, stub: cq_grpc.ConsumeQueueStub) -> None:
        try:
            offsets = {q: 0 for q in range(slot, QUEUES, threads)}
            while offsets:
                for queue_id in list(offsets):
                    response = stub.Pull(
                        cq.PullRequest(
                            topic=topic,
                            queue_id=queue_id,
                            offset=offsets[queue_id],
                            max_messages=PULL_MAX,
                        ),
                        timeout=CALL_TIMEOUT_S,
                    )
                    if response.status != cq.FOUND:
                        del offsets[queue_id]
                        continue
                    raws = split_records(response.records_blob, response.record_sizes)
                    for raw in raws:
                        record, _ = _decode(raw)
                        body_bytes[slot] += len(record.body)
                    counts[slot] += len(raws)
                    offsets[queue_id] = response.next_begin_offset
        except BaseException as err:  # reported by the caller
            errors.append(err)

    with make_channel(target) as channel:
        stub = cq_grpc.ConsumeQueueStub(channel)
        grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT_S)
        workers = [threading.Thread(target=run, args=(i, stub)) for i in range(threads)]
        gate.arrive()
        cpu0, began = time.process_time(), time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        took = time.perf_counter() - began
        cpu = time.process_time() - cpu0
    if errors:
        raise errors[0]
    if sum(counts) != expected:
        raise RuntimeError(f"consumed {sum(counts)} messages of {topic}, expected {expected}")
    return {
        "messages": sum(counts),
        "body_bytes": sum(body_bytes),
        "seconds": took,
        "client_cpu_s": cpu,
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def lookups(
    target: str,
    health_target: str,
    topic: str,
    ts_range: tuple[int, int],
    count: int,
    gate: Gate,
) -> dict[str, Any]:
    """GetOffsetByTime at random times within ts_range, each next to a GetQueueInfo and a
    health Check: latencies in ms."""
    rng = random.Random(5)
    times: dict[str, list[float]] = {"lookup": [], "queue_info": [], "health": []}
    with make_channel(target) as channel, grpc.insecure_channel(health_target) as hchannel:
        stub = cq_grpc.ConsumeQueueStub(channel)
        health = health_pb2_grpc.HealthStub(hchannel)
        grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT_S)
        grpc.channel_ready_future(hchannel).result(timeout=CALL_TIMEOUT_S)
        calls: list[tuple[str, Callable[[int, int, int], Any]]] = [
            (
                "lookup",
                lambda q, ts, i: stub.GetOffsetByTime(
                    cq.GetOffsetByTimeRequest(
                        topic=topic,
                        queue_id=q,
                        timestamp_ms=ts,
                        boundary=common_pb2.LOWER if i % 2 else common_pb2.UPPER,
                    ),
                    timeout=CALL_TIMEOUT_S,
                ),
            ),
            (
                "queue_info",
                lambda q, ts, i: stub.GetQueueInfo(
                    cq.GetQueueInfoRequest(topic=topic, queue_id=q), timeout=CALL_TIMEOUT_S
                ),
            ),
            (
                "health",
                lambda q, ts, i: health.Check(
                    health_pb2.HealthCheckRequest(service="readiness"), timeout=CALL_TIMEOUT_S
                ),
            ),
        ]
        warm_up = 50
        answers_out_of_range = 0
        for i in range(warm_up + count):
            if i == warm_up:
                gate.arrive()
                cpu0 = time.process_time()
            q = rng.randrange(QUEUES)
            ts = rng.randint(*ts_range)
            for name, call in calls:
                began = time.perf_counter()
                answer = call(q, ts, i)
                took_ms = (time.perf_counter() - began) * 1000
                if i >= warm_up:
                    times[name].append(took_ms)
                if name == "lookup" and answer.offset < 0:
                    answers_out_of_range += 1
        cpu = time.process_time() - cpu0
    out: dict[str, Any] = {"client_cpu_s": cpu, "negative_answers": answers_out_of_range}
    for name, values in times.items():
        out[name] = {"p50": _percentile(values, 0.5), "p99": _percentile(values, 0.99)}
    return out


def visible_consumer(
    target: str, topic: str, start_offset: int, expected: int, ready_path: str, timeout_s: float
) -> dict[str, Any]:
    """8 threads, each long-polling one queue from start_offset; latency of every message from
    the time_ns at the start of its body to its arrival here, in ms."""
    # (sent, latency) in ns, per queue
    latencies_ns: list[list[tuple[int, int]]] = [[] for _ in range(QUEUES)]
    received = [0] * QUEUES
    polled = threading.Barrier(QUEUES + 1, timeout=CALL_TIMEOUT_S * 2)
    deadline = time.monotonic() + timeout_s
    done = threading.Event()
    errors: list[BaseException] = []

    def run(queue_id: int, stub: cq_grpc.ConsumeQueueStub) -> None:
        offset = start_offset
        first = True
        mine = latencies_ns[queue_id]
        try:
            while not done.is_set() and time.monotonic() < deadline:
                response = stub.Pull(
                    cq.PullRequest(
                        topic=topic,
                        queue_id=queue_id,
                        offset=offset,
                        max_messages=PULL_MAX,
                        long_poll_ms=50 if first else LONG_POLL_MS,
                    ),
                    timeout=CALL_TIMEOUT_S,
                )
                arrived_ns = time.time_ns()
                if first:
                    first = False
                    polled.wait()
                if response.status != cq.FOUND:
                    continue
                raws = split_records(response.records_blob, response.record_sizes)
                for raw in raws:
                    record, _ = _decode(raw)
                    sent_ns = int.from_bytes(record.body[:8], "big")
                    mine.append((sent_ns, arrived_ns - sent_ns))
                received[queue_id] += len(raws)
                offset = response.next_begin_offset
                if sum(received) >= expected:
                    done.set()
        except BaseException as err:
            if not done.is_set():  # after it, the channel closing cancels our long poll
                errors.append(err)
            done.set()

    with make_channel(target) as channel:
        stub = cq_grpc.ConsumeQueueStub(channel)
        grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT_S)
        workers = [threading.Thread(target=run, args=(q, stub)) for q in range(QUEUES)]
        cpu0 = time.process_time()
        for w in workers:
            w.start()
        polled.wait()  # every thread has polled once: the next polls wait at the end
        Path(ready_path).touch()
        done.wait(timeout_s)
        done.set()
        cpu = time.process_time() - cpu0
    # The channel is closed: long polls still waiting end now.
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    by_sending = sorted(pair for per_queue in latencies_ns for pair in per_queue)
    all_ms = [ns / 1e6 for _, ns in by_sending]
    if not all_ms:
        raise RuntimeError(f"nothing of {topic} arrived")
    fifth = max(1, len(all_ms) // 5)
    return {
        "received": len(all_ms),
        "client_cpu_s": cpu,
        "p50": _percentile(all_ms, 0.5),
        "p99": _percentile(all_ms, 0.99),
        "max": max(all_ms),
        # A load the system cannot sustain shows as latency growing with the time sent.
        "first_fifth_p50": _percentile(all_ms[:fifth], 0.5),
        "last_fifth_p50": _percentile(all_ms[-fifth:], 0.5),
    }


def paced_producer(
    target: str, topic: str, rate: float, batches: int, gate: Gate
) -> dict[str, Any]:
    """Append batches of 100 B bodies at `rate` msg/s (up to 8 calls in flight when behind);
    each body begins with time.time_ns() read just before its Append."""
    ids = UniqIdGenerator()
    props = [
        [encode_properties({"UNIQ_KEY": ids.next_id()}) for _ in range(BATCH)]
        for _ in range(batches)
    ]
    queue_ids = [i % QUEUES for i in range(BATCH)]
    pad = os.urandom(100 - 8)
    interval_s = BATCH / rate
    tally = _Tally()
    pending: deque[Any] = deque()
    with make_channel(target) as channel:
        stub = cl_grpc.CommitLogStub(channel)
        grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT_S)
        gate.arrive()  # opened once the consumer polls
        cpu0, began = time.process_time(), time.perf_counter()
        for i in range(batches):
            delay = began + i * interval_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            while pending and (len(pending) >= 8 or pending[0].done()):
                tally.take(pending.popleft().result())
            body = time.time_ns().to_bytes(8, "big") + pad
            batch = cl.MessageBatch(
                topic=topic, queue_ids=queue_ids, bodies=[body] * BATCH, properties=props[i]
            )
            pending.append(
                stub.Append.future(cl.AppendRequest(batches=[batch]), timeout=CALL_TIMEOUT_S)
            )
        while pending:
            tally.take(pending.popleft().result())
        took = time.perf_counter() - began
        cpu = time.process_time() - cpu0
    return {"stored": tally.stored, "refused": tally.refused, "seconds": took, "client_cpu_s": cpu}


# =============================================================================================
# The orchestrator: the services, CPU accounting, sampling, the phases, the table.


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (not idle, iowait or stolen)."""
    with open("/proc/stat", encoding="ascii") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = values[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """Cores used by each service, the clients and everyone else over one phase."""

    def __init__(self, services: dict[str, ServiceProcess]) -> None:
        self.pids = {name: s.proc.pid for name, s in services.items() if s.proc is not None}

    def __enter__(self) -> CpuMeter:
        self.began = time.perf_counter()
        self.busy0 = _machine_busy_s()
        self.self0 = time.process_time()
        self.svc0 = {name: _proc_cpu_s(pid) for name, pid in self.pids.items()}
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self.began
        self.busy_s = _machine_busy_s() - self.busy0
        self.self_s = time.process_time() - self.self0
        self.svc_s = {name: _proc_cpu_s(pid) - self.svc0[name] for name, pid in self.pids.items()}

    def cores(self, client_cpu_s: float) -> dict[str, float]:
        wall = max(self.wall_s, 1e-9)
        out = {"client": client_cpu_s / wall}
        out.update({name: s / wall for name, s in self.svc_s.items()})
        ours = client_cpu_s + self.self_s + sum(self.svc_s.values())
        out["other"] = max(0.0, self.busy_s - ours) / wall
        return out


def disk_guard(directory: Path) -> tuple[list[str], str | None]:
    """Flags for commitlog_svc when other files on this disk would trip its disk protection.

    The commit log measures use as (total - available) / total (OsDisk.usage), deletes segments
    even unexpired past 85 % and refuses appends past 90 %. On a shared VM other tenants' files
    can put that within one store's worth of bytes, and a run would then measure refusals, not
    appends. Only then are the thresholds raised, and the table says so."""
    st = os.statvfs(directory)
    total = st.f_blocks * st.f_frsize
    used_ratio = (total - st.f_bavail * st.f_frsize + STORE_BYTES_MAX) / total
    if used_ratio <= DISK_CLEAN_FORCIBLY_RATIO:
        return [], None
    flags = ["--disk-max-used-ratio", "0.97", "--disk-warning-ratio", "0.99"]
    df_ratio = (st.f_blocks - st.f_bfree) / (st.f_blocks - st.f_bfree + st.f_bavail)
    note = (
        f"the commit log's measure of disk use would reach {used_ratio:.0%} during the run "
        f"({df_ratio:.0%} as df counts it), past its {DISK_CLEAN_FORCIBLY_RATIO:.0%} "
        "forced-deletion threshold, from other files on this shared disk: the run passed "
        f"`{' '.join(flags)}`"
    )
    return flags, note


def allocated_bytes(directory: Path) -> int:
    total = 0
    for base, _, names in os.walk(directory):
        for name in names:
            try:
                total += os.lstat(os.path.join(base, name)).st_blocks * 512
            except OSError:
                pass
    return total


# The followers' names in the Cluster (data directory and subscriber id), by package.
FOLLOWERS = {"cq_svc": "cq", "index_svc": "index"}


class Store:
    """commitlog_svc, cq_svc and index_svc as processes under `root` (a Cluster), default
    settings (but for `log_args`, see disk_guard); cq_svc reads records through the commit
    log's Read."""

    def __init__(self, root: Path, flush: str, log_args: list[str] | None = None) -> None:
        self.root = root
        self.cluster = Cluster(
            root,
            flush=flush,
            extra={"commitlog_svc": list(log_args or [])},
            local_reads=False,
            ready_timeout_s=READY_TIMEOUT_S,
        )
        self.log = self.cluster.commitlog
        self.followers: dict[str, ServiceProcess] = {}  # by package
        self.channels: list[grpc.Channel] = []

    def start(self, *, followers: bool = True) -> None:
        self.cluster.start_commitlog()
        for package, name in FOLLOWERS.items() if followers else ():
            self.followers[package] = self.cluster.add(package, name)
            self.cluster.start(name)

    def stop(self) -> dict[str, int]:
        for channel in self.channels:
            channel.close()
        return self.cluster.stop_all()

    @property
    def services(self) -> dict[str, ServiceProcess]:
        return {"commitlog_svc": self.log, **self.followers}

    def check_running(self) -> None:
        for name, service in self.services.items():
            if not service.running:
                raise RuntimeError(f"{name} exited; see {service.log_path}")

    def channel(self, target: str) -> grpc.Channel:
        channel = make_channel(target)
        self.channels.append(channel)
        return channel


@dataclass
class LagSample:
    at_s: float
    max_offset: int
    confirmed_lag_bytes: dict[str, int]
    confirmed_lag_ms: dict[str, int]
    applied: dict[str, int]


class Sampler:
    """Every SAMPLE_INTERVAL_S: the log's status and each follower's applied offset."""

    def __init__(self, store: Store) -> None:
        self.log = cl_grpc.CommitLogStub(store.channel(store.log.target))
        self.cq = cq_grpc.ConsumeQueueStub(store.channel(store.followers["cq_svc"].target))
        self.ix = ix_grpc.IndexStub(store.channel(store.followers["index_svc"].target))
        self.samples: list[LagSample] = []
        self.began = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-sampler", daemon=True)

    def sample(self) -> LagSample:
        status = self.log.GetStatus(cl.GetStatusRequest(), timeout=CALL_TIMEOUT_S)
        applied = {
            "cq": self.cq.GetStatus(cq.GetStatusRequest(), timeout=CALL_TIMEOUT_S).applied_offset,
            "index": self.ix.GetStatus(
                ix.GetStatusRequest(), timeout=CALL_TIMEOUT_S
            ).applied_offset,
        }
        taken = LagSample(
            at_s=time.perf_counter() - self.began,
            max_offset=status.max_offset,
            confirmed_lag_bytes={s.subscriber_id: s.lag_bytes for s in status.subscribers},
            confirmed_lag_ms={s.subscriber_id: s.lag_ms for s in status.subscribers},
            applied=applied,
        )
        self.samples.append(taken)
        return taken

    def _run(self) -> None:
        next_at = time.perf_counter()
        while not self._stop.is_set():
            self.sample()
            next_at += SAMPLE_INTERVAL_S
            self._stop.wait(max(0.0, next_at - time.perf_counter()))

    def __enter__(self) -> Sampler:
        self.began = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def wait_caught_up(self, timeout_s: float = CATCH_UP_TIMEOUT_S) -> float:
        """Seconds until every follower has applied the log's end (sampling on)."""
        began = time.perf_counter()
        while time.perf_counter() - began < timeout_s:
            taken = self.sample()
            if all(a >= taken.max_offset for a in taken.applied.values()):
                return time.perf_counter() - began
            time.sleep(SAMPLE_INTERVAL_S / 2)
        raise TimeoutError(f"followers did not catch up within {timeout_s} s")


def applied_lag(samples: list[LagSample], follower: str) -> list[tuple[float, int, float]]:
    """(time, bytes behind, ms behind) of a follower at each sample. Milliseconds behind = now
    minus when the log's end first passed the follower's applied offset (sample resolution)."""
    out = []
    for s in samples:
        behind = max(0, s.max_offset - s.applied[follower])
        behind_ms = 0.0
        if behind:
            passed = next((p.at_s for p in samples if p.max_offset > s.applied[follower]), s.at_s)
            behind_ms = (s.at_s - passed) * 1000
        out.append((s.at_s, behind, behind_ms))
    return out


def _mean_between(series: list[tuple[float, int, float]], lo_s: float, hi_s: float) -> float:
    picked = [b for t, b, _ in series if lo_s <= t <= hi_s]
    return statistics.fmean(picked) if picked else 0.0


def _slope(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of y over x (0 with fewer than 2 distinct x)."""
    if len(points) < 2:
        return 0.0
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    var = sum((x - mean_x) ** 2 for x, _ in points)
    if var == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / var


def write_samples(path: Path, samples: list[LagSample]) -> None:
    """The peak phase's samples as CSV, for a closer look than the table's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subscribers = sorted({k for s in samples for k in s.confirmed_lag_bytes})
    with open(path, "w", encoding="utf-8") as f:
        f.write(
            "t_s,max_offset,applied_cq,applied_index,"
            + ",".join(f"lag_bytes_{k},lag_ms_{k}" for k in subscribers)
            + "\n"
        )
        for s in samples:
            cells = [f"{s.at_s:.3f}", str(s.max_offset), str(s.applied["cq"])]
            cells.append(str(s.applied["index"]))
            for k in subscribers:
                cells += [str(s.confirmed_lag_bytes.get(k, "")), str(s.confirmed_lag_ms.get(k, ""))]
            f.write(",".join(cells) + "\n")


# -- the table ---------------------------------------------------------------------------------


@dataclass
class Row:
    flush: str
    what: str
    body: str
    figure: str
    note: str
    cores: dict[str, float] = field(default_factory=dict)


def _rate(values: list[float]) -> str:
    median = statistics.median(values)
    if len(values) == 1:
        return f"{median:,.0f}"
    return f"{median:,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def _cores_text(cores: dict[str, float]) -> str:
    if not cores:
        return ""
    order = ("client", "commitlog_svc", "cq_svc", "index_svc", "other")
    return " · ".join(f"{cores.get(k, 0):.2f}" for k in order)


def _median_cores(all_cores: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(c[k] for c in all_cores) for k in all_cores[0]}


def _body_name(body_bytes: int) -> str:
    return "1 KiB" if body_bytes == 1024 else f"{body_bytes} B"


HEADERS = ("flush", "measurement", "body", "result", "reads against / detail", "cores")
CORES_NOTE = "cores: client · commitlog_svc · cq_svc · index_svc · other processes"


def render_text(rows: list[Row]) -> str:
    cells = [HEADERS] + [
        (r.flush, r.what, r.body, r.figure, r.note, _cores_text(r.cores)) for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADERS))]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(len(HEADERS))) for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + f"\n{CORES_NOTE}"


def render_markdown(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + " --- |" * len(HEADERS)]
    for r in rows:
        cells = (r.flush, r.what, r.body, r.figure, r.note, _cores_text(r.cores))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + f"\n\n{CORES_NOTE} (each in cores of the 2, over the phase)."


# -- the phases --------------------------------------------------------------------------------


@contextmanager
def _progress(flush: str, phase: str) -> Iterator[None]:
    began = time.perf_counter()
    yield
    print(f"   {flush}: {phase} took {time.perf_counter() - began:.1f} s", flush=True)


# (body bytes, method) -> (msg/s, cores) of each run
ProduceRuns = dict[tuple[int, str], list[tuple[float, dict[str, float]]]]


@dataclass
class Bench:
    scale: Scale
    pool: ProcessPoolExecutor
    root: Path
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gates: int = 0
    samples_dir: Path | None = None
    log_args: list[str] = field(default_factory=list)

    def run_flush_mode(self, flush: str) -> None:
        # First the commit log alone (no subscribers): what produce costs without dispatch,
        # the reference the end-to-end produce figures are read against.
        alone = Store(self.root / f"{flush}-alone", flush, self.log_args)
        try:
            alone.start(followers=False)
            with _progress(flush, "produce, commit log alone"):
                alone_rates = self._produce_runs(alone, None)
        finally:
            self._stop(alone, flush)
        store = Store(self.root / flush, flush, self.log_args)
        try:
            store.start()
            self._phases(store, flush, alone_rates)
        finally:
            self._stop(store, flush)

    def _stop(self, store: Store, flush: str) -> None:
        codes = store.stop()
        if any(codes.values()):
            self.notes.append(f"{flush}: exit codes after SIGTERM {codes}")
        used_gb = allocated_bytes(store.root) / (1 << 30)
        print(
            f"   {flush}: the store under {store.root} took {used_gb:.1f} GiB of disk", flush=True
        )
        for name in ("commitlog", *FOLLOWERS.values()):
            shutil.rmtree(store.root / name, ignore_errors=True)

    def _gate(self) -> Gate:
        self.gates += 1
        base = self.root / f"gate-{self.gates}"
        return Gate(f"{base}.ready", f"{base}.go")

    @staticmethod
    def _arrived(path: str, *clients: Future[Any]) -> None:
        """Wait for a client to touch `path`; a client that failed first raises here."""
        while not os.path.exists(path):
            for client in clients:
                if client.done():
                    client.result()
                    raise RuntimeError(f"a client returned before touching {path}")
            time.sleep(0.001)

    def _measure(self, store: Store, fn: Callable[..., Any], *args: Any) -> tuple[Any, CpuMeter]:
        gate = self._gate()
        client = self.pool.submit(fn, *args, gate)
        self._arrived(gate.ready, client)
        with CpuMeter(store.services) as meter:
            Path(gate.go).touch()
            result = client.result()
        store.check_running()
        return result, meter

    def _phases(self, store: Store, flush: str, alone: ProduceRuns) -> None:
        sampler = Sampler(store)
        with _progress(flush, "produce"):
            self._produce(store, flush, sampler, alone)
            sampler.wait_caught_up()
        with _progress(flush, "consume"):
            self._consume(store, flush)
        with _progress(flush, "peak load"):
            peak_rate, ts_range = self._peak(store, flush)
        with _progress(flush, "append-to-visible"):
            for share in VISIBLE_SHARES:
                self._visible(store, flush, peak_rate, share, sampler)
        with _progress(flush, "time lookups"):
            self._lookups(store, flush, ts_range)

    def _produce_runs(self, store: Store, sampler: Sampler | None) -> ProduceRuns:
        """Every (body, method) run, interleaved: rate and cores of each."""
        n = self.scale.produce_messages
        results: ProduceRuns = {}
        for run in range(self.scale.runs):
            for body_bytes in BODIES:
                for method in ("unary", "stream"):
                    topic = f"p{body_bytes}-{method}-{run}"
                    got, meter = self._measure(
                        store, produce, store.log.target, topic, body_bytes, n, method
                    )
                    if got["refused"] or got["stored"] != n // BATCH * BATCH:
                        raise RuntimeError(f"{topic}: {got}")
                    results.setdefault((body_bytes, method), []).append(
                        (got["stored"] / got["seconds"], meter.cores(got["client_cpu_s"]))
                    )
                    if sampler is not None:
                        # Each run starts with followers caught up: no backlog from the last.
                        sampler.wait_caught_up()
        return results

    def _produce(self, store: Store, flush: str, sampler: Sampler, alone: ProduceRuns) -> None:
        n = self.scale.produce_messages
        results = self._produce_runs(store, sampler)
        for body_bytes in BODIES:
            for method, label in (
                ("unary", f"produce: Append, {UNARY_IN_FLIGHT} in flight"),
                ("stream", f"produce: AppendStream, window {STREAM_WINDOW}"),
            ):
                got_runs = results[(body_bytes, method)]
                rates = [r for r, _ in got_runs]
                alone_rate = statistics.median(r for r, _ in alone[(body_bytes, method)])
                mb = statistics.median(rates) * body_bytes / 1e6
                self.rows.append(
                    Row(
                        flush,
                        label,
                        _body_name(body_bytes),
                        f"{_rate(rates)} msg/s",
                        f"{statistics.median(rates) / alone_rate:.2f} of the commit log alone "
                        f"({alone_rate:,.0f} msg/s, no subscribers); {mb:.1f} MB/s of bodies; "
                        f"{n:,} msgs a run, median of {len(rates)}",
                        _median_cores([c for _, c in got_runs]),
                    )
                )

    def _consume(self, store: Store, flush: str) -> None:
        n = self.scale.produce_messages // BATCH * BATCH
        cq_target = store.followers["cq_svc"].target
        for body_bytes in BODIES:
            for threads, label in ((1, "1 Pull in flight"), (QUEUES, "8 in flight")):
                rates, cores = [], []
                for run in range(self.scale.runs):
                    topic = f"p{body_bytes}-stream-{run}"
                    got, meter = self._measure(store, consume, cq_target, topic, n, threads)
                    rates.append(got["messages"] / got["seconds"])
                    cores.append(meter.cores(got["client_cpu_s"]))
                mb = statistics.median(rates) * body_bytes / 1e6
                self.rows.append(
                    Row(
                        flush,
                        f"consume by offset: Pull x{PULL_MAX}, {label}",
                        _body_name(body_bytes),
                        f"{_rate(rates)} msg/s",
                        f"{mb:.1f} MB/s; 8 queues from 0, records decoded",
                        _median_cores(cores),
                    )
                )

    def _visible(
        self, store: Store, flush: str, peak: float, share: float, sampler: Sampler
    ) -> None:
        rate = peak * share
        topic = f"visible-{round(share * 100)}"
        # The queues must exist before a long poll waits on them (an unknown queue is answered
        # at once): one message in each, seen by cq_svc, before the consumer starts.
        log = cl_grpc.CommitLogStub(store.channel(store.log.target))
        primer = cl.MessageBatch(
            topic=topic, queue_ids=list(range(QUEUES)), bodies=[b"\0" * 8] * QUEUES
        )
        log.Append(cl.AppendRequest(batches=[primer]), timeout=CALL_TIMEOUT_S)
        sampler.wait_caught_up()
        batches = max(1, round(rate * self.scale.visible_s / BATCH))
        polling = str(self.root / flush / f"{topic}.polling")
        gate = self._gate()
        consumer = self.pool.submit(
            visible_consumer,
            store.followers["cq_svc"].target,
            topic,
            1,
            batches * BATCH,
            polling,
            self.scale.visible_s + 120,
        )
        producer = self.pool.submit(paced_producer, store.log.target, topic, rate, batches, gate)
        self._arrived(polling, consumer, producer)
        self._arrived(gate.ready, consumer, producer)
        with CpuMeter(store.services) as meter:
            Path(gate.go).touch()
            sent = producer.result()
            seen = consumer.result()
        store.check_running()
        if seen["received"] != batches * BATCH or sent["refused"]:
            raise RuntimeError(f"append-to-visible: sent {sent}, seen {seen}")
        achieved = sent["stored"] / sent["seconds"]
        first, last = seen["first_fifth_p50"], seen["last_fifth_p50"]
        # Queueing: the messages sent last waited much longer than the first ones.
        saturated = last > 2 * first + 20
        trend = f"p50 of the first / last fifth sent {first:,.0f} / {last:,.0f} ms" + (
            ": SATURATED, latency grows with the run" if saturated else ""
        )
        self.rows.append(
            Row(
                flush,
                "append-to-visible: Append paced, 8 long-polling consumers",
                "100 B",
                f"p50 {seen['p50']:.1f} ms · p99 {seen['p99']:.1f} · max {seen['max']:.1f}",
                f"offered {rate:,.0f} msg/s ({share:g} of the peak-load rate), achieved "
                f"{achieved:,.0f}; {batches * BATCH:,} msgs; {trend}",
                meter.cores(sent["client_cpu_s"] + seen["client_cpu_s"]),
            )
        )

    def _peak(self, store: Store, flush: str) -> tuple[float, tuple[int, int]]:
        """AppendStream 100 B at full speed, sampled; returns the rate it sustained and the
        store-time range it wrote."""
        sampler = Sampler(store)
        gate = self._gate()
        client = self.pool.submit(
            produce_for, store.log.target, "peak", 100, self.scale.peak_s, gate
        )
        self._arrived(gate.ready, client)
        with sampler, CpuMeter(store.services) as meter:
            Path(gate.go).touch()
            got = client.result()
            stopped_at = time.perf_counter() - sampler.began
        store.check_running()
        catch_up_s = sampler.wait_caught_up()
        if got["refused"]:
            raise RuntimeError(f"peak: {got}")
        during = [s for s in sampler.samples if s.at_s <= stopped_at]
        rate = got["stored"] / got["seconds"]

        written_mb_s = (during[-1].max_offset - during[0].max_offset) / stopped_at / 1e6
        self.rows.append(
            Row(
                flush,
                f"peak load: AppendStream at full speed, {self.scale.peak_s:.0f} s",
                "100 B",
                f"{rate:,.0f} msg/s",
                f"{written_mb_s:.1f} MB/s of records; both followers had applied everything "
                f"{catch_up_s:.1f} s after the producer stopped",
                meter.cores(got["client_cpu_s"]),
            )
        )
        for follower in ("cq", "index"):
            self.rows.append(self._lag_row(flush, follower, during, stopped_at, written_mb_s))
        if self.samples_dir is not None:
            write_samples(self.samples_dir / f"peak-{flush}.csv", sampler.samples)
        return rate, (got["first_store_ms"], got["last_store_ms"])

    def _lag_row(
        self,
        flush: str,
        follower: str,
        during: list[LagSample],
        stopped_at: float,
        written_mb_s: float,
    ) -> Row:
        series = applied_lag(during, follower)
        final_bytes, final_ms = series[-1][1], series[-1][2]
        max_bytes = max(b for _, b, _ in series)
        max_ms = max(ms for _, _, ms in series)
        mid = _mean_between(series, 0.4 * stopped_at, 0.6 * stopped_at)
        end = _mean_between(series, 0.8 * stopped_at, stopped_at)
        # Lag grows at (write rate - apply rate): its slope over the second half says whether
        # the follower keeps up. Under 5 % of the write rate is taken as noise.
        slope_mb_s = _slope([(t, b) for t, b, _ in series if t >= stopped_at / 2]) / 1e6
        if slope_mb_s <= 0.05 * written_mb_s:
            verdict = "bounded"
        else:
            verdict = (
                f"GROWS {slope_mb_s:.1f} MB/s ({slope_mb_s / written_mb_s:.0%} of the write rate)"
            )
        confirmed_ms = [s.confirmed_lag_ms.get(follower, 0) for s in during]
        confirmed_bytes = [s.confirmed_lag_bytes.get(follower, 0) for s in during]
        return Row(
            flush,
            f"dispatch lag at peak: {follower}",
            "100 B",
            f"applied: max {max_ms:,.0f} ms / {max_bytes / 1e6:.1f} MB, "
            f"final {final_ms:,.0f} ms / {final_bytes / 1e6:.1f} MB",
            f"{verdict}: mean {mid / 1e6:.1f} MB mid-phase, {end / 1e6:.1f} MB in the last "
            f"fifth; GetStatus lag_ms max {max(confirmed_ms):,} final {confirmed_ms[-1]:,}, "
            f"lag_bytes max {max(confirmed_bytes) / 1e6:.1f} MB final "
            f"{confirmed_bytes[-1] / 1e6:.1f} MB",
        )

    def _lookups(self, store: Store, flush: str, ts_range: tuple[int, int]) -> None:
        cq_svc = store.followers["cq_svc"]
        got, meter = self._measure(
            store,
            lookups,
            cq_svc.target,
            cq_svc.health_target,
            "peak",
            ts_range,
            self.scale.lookups,
        )
        look, info, health = got["lookup"], got["queue_info"], got["health"]
        self.rows.append(
            Row(
                flush,
                "time lookup: GetOffsetByTime (topic of the peak phase)",
                "100 B",
                f"p50 {look['p50']:.2f} ms · p99 {look['p99']:.2f}",
                f"{look['p50'] / info['p50']:.2f}x / {look['p99'] / info['p99']:.2f}x of "
                f"GetQueueInfo (p50 {info['p50']:.2f} · p99 {info['p99']:.2f} ms); health Check "
                f"p50 {health['p50']:.2f} · p99 {health['p99']:.2f} ms; "
                f"{self.scale.lookups:,} of each, interleaved",
                meter.cores(got["client_cpu_s"]),
            )
        )


# -- versions, the doc, main -------------------------------------------------------------------


def _git_commit() -> str:
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parent,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "?"
    return done.stdout.strip() or "?"


def versions() -> list[tuple[str, str]]:
    """What a benchmark's figures depend on: the machine, Python, gRPC, protobuf, the commit."""
    cpu = "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return [
        (
            "machine",
            f"{os.cpu_count()} cores shared with other work ({cpu}), "
            f"{platform.system()} {platform.release()}",
        ),
        ("Python", platform.python_version()),
        ("grpcio", grpc.__version__),
        ("protobuf", f"{protobuf_version} ({api_implementation.Type()})"),
        ("mqstore commit", _git_commit()),
    ]


def write_doc(path: Path, header: str, table_md: str, notes: list[str]) -> None:
    block = "\n".join(
        [
            DOC_BEGIN,
            header,
            "",
            table_md,
            *([""] + [f"- {n}" for n in notes] if notes else []),
            DOC_END,
        ]
    )
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if DOC_BEGIN in text and DOC_END in text:
        before = text.split(DOC_BEGIN, 1)[0]
        after = text.split(DOC_END, 1)[1]
        text = before + block + after
    else:
        text = (text.rstrip() + "\n\n" if text else "") + block + "\n"
    path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run (well under a minute)")
    parser.add_argument("--runs", type=int, default=None, help="runs of each produce/consume")
    parser.add_argument("--dir", default=None, help="where the data goes (default: a temp dir)")
    parser.add_argument("--flush", choices=["sync", "async", "both"], default="both")
    parser.add_argument("--doc", default=None, help="markdown file to put the table in")
    parser.add_argument("--no-doc", action="store_true", help="print only")
    parser.add_argument("--samples-dir", default=None, help="write the peak phase's lag samples")
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    if args.runs is not None:
        scale = Scale(
            scale.produce_messages, max(1, args.runs), scale.visible_s, scale.peak_s, scale.lookups
        )
    doc = None
    if not args.no_doc and (args.doc or not args.quick):
        doc = Path(args.doc or Path(__file__).resolve().parent.parent / "docs" / "bench.md")
    root = Path(tempfile.mkdtemp(prefix="mqstore-e2e-", dir=args.dir))
    started = time.perf_counter()
    modes = ["sync", "async"] if args.flush == "both" else [args.flush]
    ctx = get_context("spawn")
    try:
        with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
            bench = Bench(scale, pool, root)
            bench.log_args, disk_note = disk_guard(root)
            if disk_note:
                print(f"note: {disk_note}", flush=True)
                bench.notes.append(disk_note)
            if args.samples_dir:
                bench.samples_dir = Path(args.samples_dir)
            for flush in modes:
                print(f"-- flush {flush}: starting the services under {root / flush}", flush=True)
                bench.run_flush_mode(flush)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    took_s = time.perf_counter() - started
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    kind = "--quick (smoke run)" if args.quick else "full run"
    title = (
        f"End-to-end over gRPC, {when}, {kind}: {scale.produce_messages:,} messages a produce run, "
        f"{scale.runs} run(s) each, batches of {BATCH}, {QUEUES} queues; took {took_s:.0f} s"
    )
    print()
    print(title)
    print(render_text(bench.rows))
    for note in bench.notes:
        print(f"note: {note}")
    if doc is not None:
        table = "\n".join(f"| {k} | {v} |" for k, v in versions())
        header = f"{title}.\n\n| | |\n| --- | --- |\n{table}"
        write_doc(doc, header, render_markdown(bench.rows), bench.notes)
        print(f"table written to {doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
