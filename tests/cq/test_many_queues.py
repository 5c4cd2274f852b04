"""Many queues: open maps are bounded by the LRU, so file descriptors do not grow with queues."""

from __future__ import annotations

import os
from pathlib import Path

from cq_svc.config import CqConfig
from cq_svc.file_store import FileCqStore
from cq_svc.store import put_entries
from tests.cq.support import entries

QUEUES = 500  # far past the bound: every batch evicts and reopens maps
OPEN_MAPS_MAX = 32


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_queues_far_past_the_lru_bound_hold_at_most_that_many_maps(tmp_path: Path) -> None:
    config = CqConfig.for_tests(str(tmp_path), units_per_file=8, open_maps_max=OPEN_MAPS_MAX)
    before = open_fds()
    store = FileCqStore(config)
    store.open()
    batch = []
    for q in range(QUEUES):
        batch += entries(3, topic=f"t{q % 7}", queue_id=q, phy_base=q * 1000)
    batch.sort(key=lambda e: e.commit_log_offset)
    for i in range(0, len(batch), 500):
        put_entries(store, batch[i : i + 500])
        assert store._open_maps <= OPEN_MAPS_MAX
    # Each map keeps a descriptor; a little slack for the checkpoint's transient opens.
    assert open_fds() - before <= OPEN_MAPS_MAX + 8
    for q in range(0, QUEUES, 23):  # reading evicted queues reopens them, within the bound
        assert store.max_offset(f"t{q % 7}", q) == 3
        assert [u.commit_log_offset for u in store.read_units(f"t{q % 7}", q, 0, 5)] == [
            q * 1000,
            q * 1000 + 100,
            q * 1000 + 200,
        ]
        assert store._open_maps <= OPEN_MAPS_MAX
    store.close()
    assert open_fds() - before <= 2
    reopened = FileCqStore(config)
    report = reopened.open()
    assert report.queues == QUEUES
    assert reopened._open_maps <= OPEN_MAPS_MAX
    assert open_fds() - before <= OPEN_MAPS_MAX + 8
    last = QUEUES - 1
    assert reopened.max_offset(f"t{last % 7}", last) == 3
    reopened.close()


def test_a_queue_evicted_and_reopened_keeps_appending_where_it_was(tmp_path: Path) -> None:
    config = CqConfig.for_tests(str(tmp_path), open_maps_max=4)
    store = FileCqStore(config)
    store.open()
    put_entries(store, entries(70, topic="A"))
    put_entries(store, entries(70, topic="B", phy_base=10_000))
    put_entries(store, entries(70, topic="C", phy_base=20_000))  # evicts A (2 files + 2 time files)
    put_entries(store, entries(10, topic="A", start=70, phy_base=0))
    assert store.max_offset("A", 0) == 80
    assert [u.commit_log_offset for u in store.read_units("A", 0, 68, 5)] == [
        6800,
        6900,
        7000,
        7100,
        7200,
    ]
    store.close()
