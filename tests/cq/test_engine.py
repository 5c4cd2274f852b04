"""The engine: the start-up handshake of DESIGN.md, and the flush thread's checkpoint."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cq_svc.config import CqConfig, StoreKind
from cq_svc.engine import CqEngine
from mqstore.errors import StoreLocked, Unavailable
from mqstore.storage.simdisk import SimDisk
from tests.cq.support import apply, entries


@pytest.fixture(params=[StoreKind.FILE, StoreKind.ROCKSDB], ids=["file", "rocksdb"])
def kind(request: pytest.FixtureRequest) -> StoreKind:
    return request.param  # type: ignore[no-any-return]


def make(tmp_path: Path, kind: StoreKind, **overrides: object) -> CqEngine:
    engine = CqEngine(CqConfig.for_tests(str(tmp_path / "cq"), cq_store=kind, **overrides))
    engine.open(flush_thread=False)
    return engine


def test_a_different_store_id_drops_everything_and_rebuilds_from_the_minimum(
    tmp_path: Path, kind: StoreKind
) -> None:
    engine = make(tmp_path, kind)
    engine.handshake(b"A" * 16, 0, 0)
    apply(engine, entries(30))
    engine.store.flush()
    action = engine.handshake(b"B" * 16, 500, 9000)
    assert action.action.startswith("rebuild")
    assert action.resume_from == 500
    assert engine.store.max_offset("T", 0) == 0
    engine.close()


def test_a_log_that_lost_its_tail_truncates_the_queues(tmp_path: Path, kind: StoreKind) -> None:
    engine = make(tmp_path, kind)
    engine.handshake(b"A" * 16, 0, 0)
    apply(engine, entries(30))
    assert engine.store.flush() == 3000
    engine.close()
    engine = make(tmp_path, kind)
    action = engine.handshake(b"A" * 16, 0, 2000)
    assert action.action == "truncate"
    assert action.resume_from == 2000
    assert engine.store.max_offset("T", 0) == 20
    assert engine.store.confirmed_offset == 2000
    apply(engine, entries(15, start=20, phy_base=0))
    assert engine.store.max_offset("T", 0) == 35
    engine.close()


def test_a_log_whose_segments_expired_corrects_the_minimum(tmp_path: Path, kind: StoreKind) -> None:
    engine = make(tmp_path, kind)
    engine.handshake(b"A" * 16, 0, 0)
    apply(engine, entries(30))
    engine.store.flush()
    action = engine.handshake(b"A" * 16, 5000, 9000)
    assert action.action == "correct_min"
    assert action.resume_from == 5000
    assert engine.store.min_offset("T", 0) == 30
    engine.close()


def test_the_flush_thread_advances_the_confirmed_offset(tmp_path: Path, kind: StoreKind) -> None:
    engine = CqEngine(CqConfig.for_tests(str(tmp_path / "cq"), cq_store=kind))
    engine.open()
    apply(engine, entries(10))
    deadline = time.monotonic() + 10
    while engine.store.confirmed_offset < 1000 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.store.confirmed_offset == 1000
    engine.close()


def test_a_reconnect_truncates_entries_applied_past_a_lost_tail_even_when_not_yet_confirmed(
    tmp_path: Path, kind: StoreKind
) -> None:
    # The subscriber applied 30 entries but flushed (confirmed) only the first 10; the log then
    # restarted having lost everything from 2000 on, and the stream reconnected without this
    # process restarting: confirmed 1000 <= max 2000 < applied 3000.
    engine = make(tmp_path, kind)
    engine.handshake(b"A" * 16, 0, 0)
    apply(engine, entries(10))
    assert engine.store.flush() == 1000
    apply(engine, entries(20, start=10))
    assert engine.store.applied_offset == 3000
    action = engine.handshake(b"A" * 16, 0, 2000)
    assert action.action == "truncate"
    assert engine.store.max_offset("T", 0) == 20
    assert engine.store.applied_offset == 2000
    # The log reassigns queue offsets 20.. to new records; they must be applied, not skipped
    # as "built repeatedly" over units that point into the lost tail.
    apply(engine, entries(5, start=20, phy_base=5000 - 2000))
    units = engine.store.read_units("T", 0, 20, 5)
    assert [u.commit_log_offset for u in units] == [5000 + 100 * i for i in range(5)]
    engine.close()


def test_a_store_behind_a_wholly_expired_idle_log_counts_as_caught_up(
    tmp_path: Path, kind: StoreKind
) -> None:
    engine = make(tmp_path, kind)
    engine.handshake(b"A" * 16, 0, 0)
    apply(engine, entries(10))
    engine.store.flush()
    engine.handshake(b"A" * 16, 7000, 7000)  # every segment expired, nothing new appended
    assert engine.store.applied_offset == 7000
    assert engine.store.flush() == 7000
    assert engine.store.min_offset("T", 0) == 10
    engine.close()


def test_the_abort_marker_lives_while_open_and_a_second_engine_is_locked_out(
    tmp_path: Path, kind: StoreKind
) -> None:
    engine = make(tmp_path, kind)
    abort = tmp_path / "cq" / "cq.abort"
    assert abort.exists()
    assert not engine.unclean_start
    with pytest.raises(StoreLocked):
        make(tmp_path, kind)
    engine.close()
    assert not abort.exists()
    again = make(tmp_path, kind)
    assert not again.unclean_start
    again.close()
    # A process that dies without closing leaves the marker behind: the next open says so.
    abort.write_bytes(b"")
    last = make(tmp_path, kind)
    assert last.unclean_start
    last.close()


def test_a_failed_flush_makes_the_engine_unhealthy_refuses_writes_and_keeps_the_abort_marker() -> (
    None
):
    disk = SimDisk()
    engine = CqEngine(CqConfig.for_tests("/d"), disk=disk)
    engine.open()
    assert engine.healthy
    disk.inject("flush", times=1_000)
    apply(engine, entries(10))
    deadline = time.monotonic() + 10
    while engine.healthy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not engine.healthy
    with pytest.raises(Unavailable):
        apply(engine, entries(5, start=10))
    confirmed = engine.store.confirmed_offset
    disk.clear_faults()  # even if a flush would succeed now, close must not retry one
    engine.close()
    assert disk.exists("/d/cq.abort")  # the next start knows the exit was not clean
    again = CqEngine(CqConfig.for_tests("/d"), disk=disk)
    assert again.open(flush_thread=False).confirmed_offset == confirmed < 1000
    assert again.unclean_start
    again.close()
