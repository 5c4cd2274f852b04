"""mqstore_gc_pause_seconds: every collection's pause, by generation, once measuring is on."""

from __future__ import annotations

import gc

from prometheus_client import REGISTRY, generate_latest

from mqstore.rpc.collector import NAME, measure_pauses


def _count(generation: int) -> float:
    value = REGISTRY.get_sample_value(f"{NAME}_count", {"generation": str(generation)})
    return 0.0 if value is None else value


def test_each_collection_is_one_pause_of_its_generation_and_measuring_twice_counts_once() -> None:
    measure_pauses()
    measure_pauses()  # a second service host in the process: still one callback
    before = [_count(g) for g in (0, 1, 2)]
    gc.collect(2)
    gc.collect(0)
    after = [_count(g) for g in (0, 1, 2)]
    assert after[2] - before[2] == 1
    assert after[0] - before[0] >= 1  # (the young generation may also run on its own)
    text = generate_latest(REGISTRY).decode()
    assert f'{NAME}_bucket{{generation="2",le="+Inf"}}' in text
