"""What the orchestrator hands each system's benchmark: the scale, the client pool, the results
and the way to run a client under a CPU meter."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.meters import CpuMeter, wait_for_quiet
from bench.peers.common import CALL_TIMEOUT_S, FOREIGN_NOISY_CORES, Results, Scale
from bench.peers.pacing import READY_TIMEOUT_S
from bench.processes import wait_for_client

# A whole client call (a produce run of 200k messages at a few thousand msg/s included).
CLIENT_TIMEOUT_S = 900.0
# Most a whole run waits for foreign load to settle (Scale.settle_s before each call).
SETTLE_BUDGET_S = 300.0


@dataclass
class Context:
    scale: Scale
    # The client processes of the system being run (run.py starts a pool for each).
    pool: ProcessPoolExecutor | None
    root: Path
    results: Results = field(default_factory=Results)
    # Offered rate of append-to-visible, per message size: half of mqstore's peak produce rate.
    visible_rates: dict[int, float] = field(default_factory=dict)
    visible_rate_source: str = ""
    started: float = field(default_factory=time.perf_counter)
    settled_s: float = 0.0  # waited in total for foreign load to drop

    @property
    def clients(self) -> ProcessPoolExecutor:
        if self.pool is None:
            raise RuntimeError("no client pool: a system's benchmark runs inside run_bench")
        return self.pool

    def settle(self) -> None:
        """Wait a while for foreign load to drop before a measured call, within a budget for
        the whole run (a neighbour busy all along must not stretch it by an hour)."""
        left = SETTLE_BUDGET_S - self.settled_s
        if self.scale.settle_s > 0 and left > 0:
            self.settled_s += wait_for_quiet(min(self.scale.settle_s, left), FOREIGN_NOISY_CORES)

    def say(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.started:6.1f} s] {text}", flush=True)

    def measure(
        self, servers: Mapping[str, int], fn: Callable[..., dict[str, Any]], *args: Any
    ) -> tuple[dict[str, Any], CpuMeter]:
        """Run `fn(*args)` in a client process under a CPU meter."""
        self.settle()
        with CpuMeter(servers, tree=True) as meter:
            got = self.clients.submit(fn, *args).result(timeout=CLIENT_TIMEOUT_S)
        return got, meter

    def measure_pair(
        self,
        servers: Mapping[str, int],
        consumer: tuple[Callable[..., dict[str, Any]], tuple[Any, ...]],
        producer: tuple[Callable[..., dict[str, Any]], tuple[Any, ...]],
        ready_path: str,
    ) -> tuple[dict[str, Any], dict[str, Any], CpuMeter]:
        """A consumer process, started first and waited for until it touches `ready_path`
        (subscribed, polling), then a producer process; the meter covers the producer's run
        until the consumer has everything."""
        self.settle()
        seen = self.clients.submit(consumer[0], *consumer[1])
        wait_for_client(ready_path, seen, timeout_s=READY_TIMEOUT_S + CALL_TIMEOUT_S)
        with CpuMeter(servers, tree=True) as meter:
            sent = self.clients.submit(producer[0], *producer[1])
            sent_got = sent.result(timeout=CLIENT_TIMEOUT_S)
            seen_got = seen.result(timeout=CLIENT_TIMEOUT_S)
        return sent_got, seen_got, meter
