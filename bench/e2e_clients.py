"""The clients of bench/e2e_bench.py: functions that run in the orchestrator's spawned worker
processes, never in a service's or the orchestrator's process.

Each connects, builds what it sends, then arrives at its Gate (bench/processes.py) so that the
orchestrator's CPU meter starts with the measured window; each returns plain data (counts,
seconds, latencies) and the CPU seconds its own process used over the window (a Stopwatch).

- produce / produce_for: columnar Append batches, unary (UNARY_IN_FLIGHT futures) or
  AppendStream (STREAM_WINDOW in flight), a count of messages or a time at full speed;
- consume: Pull every queue from 0 to its end, each record decoded as a consumer must;
- lookups: GetOffsetByTime interleaved with GetQueueInfo and the health Check;
- visible_consumer / paced_producer: append-to-visible, each body starting with the time it
  was sent.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.meters import Stopwatch
from bench.processes import Gate
from bench.report import percentile
from mqstore.formats.msgid import UniqIdGenerator
from mqstore.formats.properties import decode_properties, encode_properties
from mqstore.formats.record import Record, read_record
from mqstore.formats.record_columns import split_records
from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc
from mqstore.rpc.gen.common.v1 import common_pb2
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc as cq_grpc

BATCH = 1000  # messages per Append request, as the producer SDK batches them
QUEUES = 8
UNARY_IN_FLIGHT = 4  # Append futures outstanding: enough to hide one round trip per call
STREAM_WINDOW = 8  # AppendStream requests outstanding (the server reads up to 16 ahead)
PULL_MAX = 1000  # max_messages per Pull (the server caps at 1,024)
LONG_POLL_MS = 2000
CALL_TIMEOUT_S = 30.0
# Unique UNIQ_KEYs cost ~2 us a message to make: the peak-load phase, which runs for a time
# rather than a count, cycles through this many prebuilt requests instead.
PEAK_POOL_BATCHES = 200
LOOKUP_WARM_UP = 50
PACED_IN_FLIGHT = 8  # Append futures the paced producer lets pile up when behind


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

    def result(self, clock: Stopwatch) -> dict[str, Any]:
        return {
            "stored": self.stored,
            "refused": self.refused,
            "seconds": clock.wall_s,
            "client_cpu_s": clock.cpu_s,
            "first_store_ms": self.first_store_ms,
            "last_store_ms": self.last_store_ms,
        }


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
    return _timed_sends(target, gate, send, lambda: iter(requests))


def produce_for(
    target: str, topic: str, body_bytes: int, seconds: float, gate: Gate
) -> dict[str, Any]:
    """AppendStream at full speed for `seconds`, cycling through prebuilt requests."""
    pool = build_requests(topic, body_bytes, PEAK_POOL_BATCHES)

    def until_time() -> Iterator[cl.AppendRequest]:
        stop_at = time.perf_counter() + seconds  # from the first request, on the clock
        i = 0
        while time.perf_counter() < stop_at:
            yield pool[i % len(pool)]
            i += 1

    return _timed_sends(target, gate, _send_stream, until_time)


def _timed_sends(
    target: str,
    gate: Gate,
    send: Callable[[cl_grpc.CommitLogStub, Iterator[cl.AppendRequest], _Tally], None],
    requests: Callable[[], Iterator[cl.AppendRequest]],
) -> dict[str, Any]:
    """Connect, wait at the gate, then time `send` over `requests()`."""
    tally = _Tally()
    with make_channel(target) as channel:
        stub = cl_grpc.CommitLogStub(channel)
        grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT_S)
        gate.arrive()
        with Stopwatch() as clock:
            send(stub, requests(), tally)
    return tally.result(clock)


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
        with Stopwatch() as clock:
            for w in workers:
                w.start()
            for w in workers:
                w.join()
    if errors:
        raise errors[0]
    if sum(counts) != expected:
        raise RuntimeError(f"consumed {sum(counts)} messages of {topic}, expected {expected}")
    return {
        "messages": sum(counts),
        "body_bytes": sum(body_bytes),
        "seconds": clock.wall_s,
        "client_cpu_s": clock.cpu_s,
    }


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
        answers_out_of_range = 0
        clock = Stopwatch()
        for i in range(LOOKUP_WARM_UP + count):
            if i == LOOKUP_WARM_UP:
                gate.arrive()
                clock.start()
            q = rng.randrange(QUEUES)
            ts = rng.randint(*ts_range)
            for name, call in calls:
                began = time.perf_counter()
                answer = call(q, ts, i)
                took_ms = (time.perf_counter() - began) * 1000
                if i >= LOOKUP_WARM_UP:
                    times[name].append(took_ms)
                if name == "lookup" and answer.offset < 0:
                    answers_out_of_range += 1
        clock.stop()
    out: dict[str, Any] = {"client_cpu_s": clock.cpu_s, "negative_answers": answers_out_of_range}
    for name, values in times.items():
        out[name] = {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99)}
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
        with Stopwatch() as clock:
            for w in workers:
                w.start()
            polled.wait()  # every thread has polled once: the next polls wait at the end
            Path(ready_path).touch()
            done.wait(timeout_s)
            done.set()
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
        "client_cpu_s": clock.cpu_s,
        "p50": percentile(all_ms, 0.5),
        "p99": percentile(all_ms, 0.99),
        "max": max(all_ms),
        # A load the system cannot sustain shows as latency growing with the time sent.
        "first_fifth_p50": percentile(all_ms[:fifth], 0.5),
        "last_fifth_p50": percentile(all_ms[-fifth:], 0.5),
    }


def paced_producer(
    target: str, topic: str, rate: float, batches: int, gate: Gate
) -> dict[str, Any]:
    """Append batches of 100 B bodies at `rate` msg/s (up to PACED_IN_FLIGHT calls in flight
    when behind); each body begins with time.time_ns() read just before its Append."""
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
        with Stopwatch() as clock:
            began = time.perf_counter()
            for i in range(batches):
                delay = began + i * interval_s - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                while pending and (len(pending) >= PACED_IN_FLIGHT or pending[0].done()):
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
    return tally.result(clock)
