"""The cyclic garbage collector's pauses in a service: `mqstore_gc_pause_seconds`, by generation.

Every thread of a process stops while the collector runs. Under load the pauses this
histogram shows are a small part of a service's time, and freezing the start-up heap
(gc.freeze) does not change them, so the services leave the collector as it is (figures in
docs/bench.md).

The callback takes no lock: a collection may start in any thread at any allocation, also in
one holding a lock of prometheus_client (its scrape copies a metric's children under the
metric's own lock), and a callback taking that lock would wait for itself. It only adds to
plain lists; the metrics port reads them when scraped (`_PauseCollector`).
"""

from __future__ import annotations

import bisect
import gc
import threading
import time
from collections.abc import Iterator
from typing import Any, Final

from prometheus_client.core import REGISTRY, HistogramMetricFamily
from prometheus_client.registry import Collector

NAME: Final = "mqstore_gc_pause_seconds"
# From 100 us (a young collection) to 250 ms (a full one over a large heap).
GC_PAUSE_BUCKETS_S: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                             0.1, 0.25)  # fmt: skip
GENERATIONS: Final = 3

# Per generation: pauses per bucket (the last one: over every bound), and their sum in seconds.
_counts = [[0] * (len(GC_PAUSE_BUCKETS_S) + 1) for _ in range(GENERATIONS)]
_sums = [0.0] * GENERATIONS
_started_at = [0.0]
_install_lock = threading.Lock()


def _observe(phase: str, info: dict[str, Any]) -> None:
    # Run by the collector, GIL held, on whichever thread set it off: no lock, no container
    # made (list items replaced, floats and ints only).
    if phase == "start":
        _started_at[0] = time.perf_counter()
        return
    took = time.perf_counter() - _started_at[0]
    generation = info["generation"]
    _counts[generation][bisect.bisect_left(GC_PAUSE_BUCKETS_S, took)] += 1
    _sums[generation] += took


class _PauseCollector(Collector):
    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            NAME,
            "Pauses of the cyclic garbage collector (every thread stops), by generation.",
            labels=["generation"],
        )
        for generation in range(GENERATIONS):
            running = 0
            buckets: list[tuple[str, float]] = []
            for bound, count in zip(
                (*map(str, GC_PAUSE_BUCKETS_S), "+Inf"), list(_counts[generation]), strict=True
            ):
                running += count
                buckets.append((bound, float(running)))
            family.add_metric([str(generation)], buckets, _sums[generation])
        yield family


_collector = _PauseCollector()
_registered = [False]


def measure_pauses() -> None:
    """Count every collection's pause (once a process) and serve them as NAME."""
    with _install_lock:
        if not _registered[0]:
            REGISTRY.register(_collector)
            _registered[0] = True
        if _observe not in gc.callbacks:
            gc.callbacks.append(_observe)
