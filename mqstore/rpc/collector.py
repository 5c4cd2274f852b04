"""The cyclic garbage collector's pauses in a service: `mqstore_gc_pause_seconds`, by generation.

Every thread of a process stops while the collector runs. Measured with this histogram on the
2-core VM at 64,000 msg/s of append-to-visible (bench.visible_probe): commitlog_svc ~50 ms of
collection in a 5 s run (one pause over 5 ms), cq_svc 0-2 ms, index_svc none; freezing the
start-up heap (gc.freeze) changed none of it, so the services leave the collector as it is.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any, Final

from prometheus_client import Histogram

# From 100 us (a young collection) to 250 ms (a full one over a large heap).
GC_PAUSE_BUCKETS_S: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                             0.1, 0.25)  # fmt: skip

GC_PAUSE = Histogram(
    "mqstore_gc_pause_seconds",
    "Pauses of the cyclic garbage collector (every thread stops), by generation.",
    ["generation"],
    buckets=GC_PAUSE_BUCKETS_S,
)

_install_lock = threading.Lock()
_started_at: list[float] = [0.0]


def _observe(phase: str, info: dict[str, Any]) -> None:
    # Called by the collector with the GIL held, on the thread that triggered it.
    if phase == "start":
        _started_at[0] = time.perf_counter()
    else:
        GC_PAUSE.labels(str(info["generation"])).observe(time.perf_counter() - _started_at[0])


def measure_pauses() -> None:
    """Observe every collection's pause in GC_PAUSE (once a process)."""
    with _install_lock:
        if _observe not in gc.callbacks:
            gc.callbacks.append(_observe)
