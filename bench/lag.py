"""The dispatch-lag meter of bench/e2e_bench.py: how far cq_svc and index_svc trail the commit
log while it is written to, sampled over gRPC.

`Sampler` takes, every SAMPLE_INTERVAL_S (in a thread of its own while a `with` block runs, or
when asked), the commit log's GetStatus (its end, and each subscriber's lag_bytes / lag_ms to
its *confirmed* offset: applied, flushed and reported) and each follower's GetStatus
(applied_offset: what a Pull or a query can already see). `applied_lag` turns the samples
into bytes and milliseconds behind; `slope` says whether a lag grows; `write_samples` keeps
them as CSV.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc as cq_grpc
from mqstore.rpc.gen.index.v1 import index_pb2 as ix
from mqstore.rpc.gen.index.v1 import index_pb2_grpc as ix_grpc

SAMPLE_INTERVAL_S = 0.1
CALL_TIMEOUT_S = 30.0
CATCH_UP_TIMEOUT_S = 180.0


@dataclass
class LagSample:
    at_s: float
    max_offset: int
    confirmed_lag_bytes: dict[str, int]
    confirmed_lag_ms: dict[str, int]
    applied: dict[str, int]


class Sampler:
    """Every SAMPLE_INTERVAL_S: the log's status and each follower's applied offset."""

    def __init__(self, log: grpc.Channel, cq_svc: grpc.Channel, index_svc: grpc.Channel) -> None:
        self.log = cl_grpc.CommitLogStub(log)
        self.cq = cq_grpc.ConsumeQueueStub(cq_svc)
        self.ix = ix_grpc.IndexStub(index_svc)
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


def mean_between(series: list[tuple[float, int, float]], lo_s: float, hi_s: float) -> float:
    picked = [b for t, b, _ in series if lo_s <= t <= hi_s]
    return statistics.fmean(picked) if picked else 0.0


def slope(points: list[tuple[float, int]]) -> float:
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
