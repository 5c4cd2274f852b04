"""File store recovery: the decision table of queue_files.py and the corruption tables for unit
files and time companions, on the simulated disk."""

from __future__ import annotations

import random

import pytest

from cq_svc.config import CqConfig
from cq_svc.file_store import FileCqStore
from cq_svc.store import put_entries
from mqstore.formats.cq_time import Boundary
from mqstore.storage.clock import ManualClock
from mqstore.storage.mapped_file_queue import StoreLoadError
from mqstore.storage.simdisk import SimDisk
from tests.cq.support import entries

DATA = "/d"
UNIT_DIR = f"{DATA}/consumequeue/T/0"
TIME_DIR = f"{DATA}/consumequeue_time/T/0"
UNITS_PER_FILE = 50


def open_store(disk: SimDisk, clock: ManualClock | None = None) -> FileCqStore:
    store = FileCqStore(CqConfig.for_tests(DATA), disk=disk, clock=clock or ManualClock())
    store.open()
    return store


def poke(disk: SimDisk, path: str, pos: int, data: bytes) -> None:
    """Change bytes of a file as media corruption would (durable, no crash needed)."""
    size = disk.size(path)
    region = disk.map(path, size)
    region.buf[pos : pos + len(data)] = data
    region.flush(0, size)


def unit_file(n: int) -> str:
    return f"{UNIT_DIR}/{n * UNITS_PER_FILE * 20:020d}"


def time_file(n: int) -> str:
    return f"{TIME_DIR}/{n * UNITS_PER_FILE * 8:020d}"


# -- the decision table --------------------------------------------------------------------------


def test_valid_flushed_units_are_kept_after_a_crash() -> None:
    disk = SimDisk()
    store = open_store(disk)
    put_entries(store, entries(70))
    assert store.flush() == 7000
    disk.crash(random.Random(1), "drop")
    store = open_store(disk)
    assert store.max_offset("T", 0) == 70
    assert store.confirmed_offset == 7000


def test_unflushed_units_lost_in_a_crash_end_the_queue_at_the_zero_unit() -> None:
    disk = SimDisk()
    store = open_store(disk)
    put_entries(store, entries(30))
    store.flush()
    put_entries(store, entries(30, start=30))
    disk.crash(random.Random(1), "drop")
    store = open_store(disk)
    assert store.max_offset("T", 0) == 30
    assert put_entries(store, entries(60)) == 30  # the subscriber re-sends from 3000
    assert store.max_offset("T", 0) == 60


def test_units_beyond_the_confirmed_offset_are_cut_even_when_they_survived() -> None:
    disk = SimDisk()
    store = open_store(disk)
    put_entries(store, entries(30))
    store.flush()
    put_entries(store, entries(40, start=30))  # rolls into a second file, not flushed
    store.flush(least_pages=1000)  # an interval flush does not advance the checkpoint
    disk.crash(random.Random(1), "keep")
    store = open_store(disk)
    assert store.confirmed_offset == 3000
    assert store.max_offset("T", 0) == 30
    # The cut tail is zeroed and the file after it deleted, so nothing stale can come back.
    raw = disk.read(unit_file(0))
    assert raw[30 * 20 :] == bytes(len(raw) - 30 * 20)
    assert not disk.exists(unit_file(1))
    assert not disk.exists(time_file(1))


@pytest.mark.parametrize(
    ("name", "at", "data"),
    [
        ("zeroed unit", 17, bytes(20)),
        ("negative phy", 17, b"\xff" * 8 + (100).to_bytes(4, "big") + bytes(8)),
        ("size zero", 17, (1700).to_bytes(8, "big") + bytes(12)),
        ("phy going backwards", 17, (5).to_bytes(8, "big") + (100).to_bytes(4, "big") + bytes(8)),
        ("garbage in the next file's first unit", 50, b"\xff" * 20),
    ],
)
def test_a_bad_unit_ends_the_queue_there_and_appends_resume(
    name: str, at: int, data: bytes
) -> None:
    disk = SimDisk()
    store = open_store(disk)
    put_entries(store, entries(60))
    store.close()
    poke(disk, unit_file(at // UNITS_PER_FILE), (at % UNITS_PER_FILE) * 20, data)
    store = open_store(disk)
    assert store.max_offset("T", 0) == at, name
    assert [u.queue_offset for u in store.read_units("T", 0, 0, 100)] == list(range(at))
    put_entries(store, entries(60))  # the rebuild (a re-dispatch from the log) fills it again
    assert store.max_offset("T", 0) == 60
    assert [u.commit_log_offset for u in store.read_units("T", 0, 0, 100)] == [
        100 * i for i in range(60)
    ]


def test_trailing_garbage_after_the_last_unit_is_cut() -> None:
    disk = SimDisk()
    store = open_store(disk)
    put_entries(store, entries(20))
    store.close()
    poke(disk, unit_file(0), 20 * 20, b"\x7f" * 60)  # huge positive phys: beyond C
    store = open_store(disk)
    assert store.max_offset("T", 0) == 20
    assert disk.read(unit_file(0))[20 * 20 : 23 * 20] == bytes(60)


def test_only_the_last_three_files_are_scanned() -> None:
    disk = SimDisk()
    store = open_store(disk)
    put_entries(store, entries(5 * UNITS_PER_FILE))
    store.close()
    poke(disk, unit_file(0), 3 * 20, bytes(20))  # damage in file 0 goes unseen, as in RocketMQ
    store = open_store(disk)
    assert store.max_offset("T", 0) == 5 * UNITS_PER_FILE


def test_a_unit_file_of_the_wrong_size_refuses_to_load() -> None:
    disk = SimDisk()
    store = open_store(disk)
    put_entries(store, entries(120))
    store.close()
    disk.truncate(unit_file(0), 500)
    with pytest.raises(StoreLoadError):
        open_store(disk)


def test_a_lost_or_corrupt_checkpoint_trusts_no_unit() -> None:
    disk = SimDisk()
    store = open_store(disk)
    put_entries(store, entries(20))
    store.close()
    poke(disk, f"{DATA}/cq_checkpoint", 20, b"\x00\x01")
    store = open_store(disk)
    assert store.confirmed_offset == 0
    assert store.max_offset("T", 0) == 0
    put_entries(store, entries(20))
    assert store.max_offset("T", 0) == 20


# -- time companion corruption -------------------------------------------------------------------


def _times(store: FileCqStore) -> list[int]:
    return [u.store_timestamp_ms for u in store.read_units("T", 0, 0, 1000)]


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("zeroed entry", lambda disk: poke(disk, time_file(0), 12 * 8, bytes(8))),
        ("flipped bit", lambda disk: poke(disk, time_file(0), 12 * 8 + 5, b"\x01")),
        ("zeroed page", lambda disk: poke(disk, time_file(0), 0, bytes(UNITS_PER_FILE * 8))),
        ("torn last entry", lambda disk: poke(disk, time_file(0), 39 * 8 + 3, b"\x00" * 5)),
    ],
)
def test_a_damaged_time_entry_is_repaired_upwards_and_units_stay(name: str, damage) -> None:  # type: ignore[no-untyped-def]
    disk = SimDisk()
    store = open_store(disk)
    put_entries(store, entries(40, time_base=1000, time_step=10))
    good = _times(store)
    store.close()
    damage(disk)
    store = open_store(disk, ManualClock(now_ms=9_999_999))
    assert store.max_offset("T", 0) == 40, name
    repaired = _times(store)
    assert repaired == sorted(repaired), name  # still non-decreasing
    assert all(r >= g for r, g in zip(repaired, good, strict=True)), name  # only ever raised
    # The guarantees hold: LOWER never skips a message stored at or after T.
    for t in range(990, 1420, 7):
        lo = store.get_offset_by_time("T", 0, t, Boundary.LOWER)
        assert all(g < t for g in good[:lo]), (name, t)
        up = store.get_offset_by_time("T", 0, t, Boundary.UPPER)
        assert up == 0 or all(g <= t for g in good[: up + 1]), (name, t)


def test_a_missing_time_tree_is_rebuilt_and_lookups_stay_safe() -> None:
    disk = SimDisk()
    store = open_store(disk)
    put_entries(store, entries(70, time_base=1000, time_step=10))
    store.close()
    disk.remove_tree(TIME_DIR)
    store = open_store(disk, ManualClock(now_ms=5_000))
    assert store.max_offset("T", 0) == 70
    assert store.get_offset_by_time("T", 0, 1200, Boundary.LOWER) == 0  # earlier, never later
    put_entries(store, entries(5, start=70, time_base=6000))
    assert store.get_offset_by_time("T", 0, 6000, Boundary.LOWER) == 70


def test_a_time_entry_damaged_outside_the_recovery_scan_is_read_as_the_next_good_one() -> None:
    disk = SimDisk()
    store = open_store(disk)
    put_entries(store, entries(5 * UNITS_PER_FILE, time_base=0, time_step=10))
    store.close()
    poke(disk, time_file(0), 10 * 8, bytes(8))
    store = open_store(disk)
    assert _times(store)[10] == 0  # raw read: the damaged entry
    assert store.get_offset_by_time("T", 0, 100, Boundary.LOWER) == 10
    assert store.get_offset_by_time("T", 0, 95, Boundary.LOWER) == 10


def test_queues_evicted_unflushed_are_made_durable_by_the_next_full_flush() -> None:
    disk = SimDisk()
    store = FileCqStore(CqConfig.for_tests(DATA, open_maps_max=4), disk=disk, clock=ManualClock())
    store.open()
    for q in range(6):  # each queue: 2 unit + 2 time files; the LRU keeps one queue open
        put_entries(store, entries(60, queue_id=q, phy_base=q * 100_000))
    assert store._open_maps <= 4
    store.flush()
    disk.crash(random.Random(3), "drop")
    store = open_store(disk)
    assert [store.max_offset("T", q) for q in range(6)] == [60] * 6
    assert [u.commit_log_offset for u in store.read_units("T", 2, 58, 5)] == [205_800, 205_900]
