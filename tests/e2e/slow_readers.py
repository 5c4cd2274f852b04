"""Slow readers of cq_svc's Follow streams, and the Pulls of everyone else (issue 23, item 4).

`SlowReaders` runs, in a process of its own (so that its threads take nothing from the
process that times the Pulls), `streams` Follow calls over the queues of a topic with a
backlog, each reading one answer every `read_every_s`; a refused or ended call is opened again
after the same pause, as a naive client does. `probe_pulls` times unary Pulls of another queue
meanwhile and samples the service's anonymous memory.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event

import grpc

from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc as cq_grpc
from tests.e2e.malformed import anon_bytes

# Follow calls per channel (HTTP/2 connection): a client with many streams opens a few.
STREAMS_PER_CHANNEL = 10
FOLLOW_TIMEOUT_S = 120.0
PULL_TIMEOUT_S = 5.0


def _read_slowly(
    target: str, topic: str, queues: int, streams: int, read_every_s: float, stop: Event
) -> None:
    """The child process: `streams` threads, each following every queue of `topic` from 0.
    At a lower priority: in production the readers run elsewhere, and here their CPU would
    otherwise be taken from the service whose latency is measured."""
    os.nice(10)
    channels = [grpc.insecure_channel(target) for _ in range(-(-streams // STREAMS_PER_CHANNEL))]
    request = cq.FollowRequest(
        pulls=[
            cq.PullRequest(topic=topic, queue_id=q, offset=0, max_messages=1_024)
            for q in range(queues)
        ],
        long_poll_ms=30_000,
    )

    def reader(i: int) -> None:
        stub = cq_grpc.ConsumeQueueStub(channels[i // STREAMS_PER_CHANNEL])
        while not stop.is_set():
            call = stub.Follow(request, timeout=FOLLOW_TIMEOUT_S)
            try:
                for _ in call:
                    if stop.wait(read_every_s):
                        break
            except grpc.RpcError:
                pass
            finally:
                call.cancel()
            stop.wait(read_every_s)

    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(streams)]
    for t in threads:
        t.start()
    stop.wait()
    for channel in channels:
        channel.close()


class SlowReaders:
    def __init__(
        self, target: str, topic: str, queues: int, streams: int, read_every_s: float = 1.0
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._process = context.Process(
            target=_read_slowly,
            args=(target, topic, queues, streams, read_every_s, self._stop),
            daemon=True,
        )

    def __enter__(self) -> SlowReaders:
        self._process.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._process.join(30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Probe:
    """Pull latencies (seconds, sorted), failures by code, the memory samples (bytes) and the
    service's CPU time over the probe (seconds, of `seconds`)."""

    latencies_s: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    anon: list[int] = field(default_factory=list)
    cpu_s: float = 0.0
    seconds: float = 0.0

    def quantile_ms(self, q: float) -> float:
        if not self.latencies_s:
            return float("nan")
        return (
            1000 * self.latencies_s[min(len(self.latencies_s) - 1, int(q * len(self.latencies_s)))]
        )

    @property
    def peak_anon(self) -> int:
        return max(self.anon, default=0)

    def figures(self, name: str) -> str:
        return (
            f"{name}: {len(self.latencies_s)} pulls, p50 {self.quantile_ms(0.5):.1f} ms, "
            f"p99 {self.quantile_ms(0.99):.1f} ms, max {self.quantile_ms(1.0):.0f} ms, "
            f"failed {self.failures}; cq_svc anon peak {self.peak_anon / (1 << 20):.0f} MiB, "
            f"CPU {self.cpu_s / self.seconds if self.seconds else 0:.2f} cores"
        )


def probe_pulls(
    stub: cq_grpc.ConsumeQueueStub,
    request: cq.PullRequest,
    seconds: float,
    pid: int,
    *,
    pause_s: float = 0.01,
    sample_every_s: float = 0.25,
) -> Probe:
    """Pulls one after another for `seconds` (a pause between), the memory of the service
    (process `pid`) sampled and its CPU time taken."""
    probe = Probe(seconds=seconds)
    cpu_before = cpu_seconds(pid)
    end = time.monotonic() + seconds
    next_sample = 0.0
    while (now := time.monotonic()) < end:
        if now >= next_sample:
            probe.anon.append(anon_bytes(pid))
            next_sample = now + sample_every_s
        began = time.monotonic()
        try:
            stub.Pull(request, timeout=PULL_TIMEOUT_S)
            probe.latencies_s.append(time.monotonic() - began)
        except grpc.RpcError as err:
            name = err.code().name
            probe.failures[name] = probe.failures.get(name, 0) + 1
        time.sleep(pause_s)
    probe.anon.append(anon_bytes(pid))
    probe.cpu_s = cpu_seconds(pid) - cpu_before
    probe.latencies_s.sort()
    return probe


def wait_for_queues(
    stub: cq_grpc.ConsumeQueueStub, topic: str, queue_ids: Sequence[int], count: int
) -> None:
    """Until every queue holds `count` messages (the dispatch has caught up)."""
    deadline = time.monotonic() + 60
    for q in queue_ids:
        while (
            stub.GetQueueInfo(
                cq.GetQueueInfoRequest(topic=topic, queue_id=q), timeout=10
            ).max_offset
            < count
        ):
            assert time.monotonic() < deadline, f"{topic}/{q} never reached {count}"
            time.sleep(0.1)
