"""The engine behind the subscriber loop: what it tells the commit log when it subscribes, how
handshakes and batches reach the engine, and the idle flusher (and its failure)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from index_svc.config import IndexConfig
from index_svc.engine import IndexEngine
from index_svc.sink import Flusher, IndexSink
from mqstore.dispatch import DispatchEntry
from mqstore.history import LogHistory
from mqstore.rpc.subscriber import wait_until
from mqstore.storage.clock import ManualClock
from mqstore.storage.simdisk import SimDisk
from tests.index_svc.support import STORE_ID, sample

# The log as the handshake gives it: one epoch from its start.
ONE_EPOCH = LogHistory([(1, 0)])

OTHER_STORE_ID = bytes(16 * [0xEE])


def entry(offset: int, keys: str = "k", ts: int = 1_700_000_000_000) -> DispatchEntry:
    return DispatchEntry("T", 0, 0, offset, 50, 0, ts, 0, keys, "")


@pytest.fixture
def engine(tmp_path: Path) -> IndexEngine:
    e = IndexEngine(IndexConfig.for_tests(str(tmp_path), flush_interval_ms=20))
    e.open()
    yield e
    e.close()


def test_a_new_replica_subscribes_with_an_empty_store_id_and_offset_zero(
    engine: IndexEngine,
) -> None:
    sink = IndexSink(engine)
    assert (sink.store_id, sink.confirmed_offset, sink.applied_offset) == (b"", 0, 0)


def test_batches_are_applied_once_and_replays_change_nothing(engine: IndexEngine) -> None:
    sink = IndexSink(engine)
    sink.on_handshake(STORE_ID, 0, 150, 150, ONE_EPOCH)
    assert sink.store_id == STORE_ID
    keys_before = sample("mqstore_index_keys_indexed_total")
    batch = [entry(0), entry(50, "a b"), entry(100, "")]
    sink.on_batch(batch, 150)
    sink.on_batch(batch, 150)  # re-sent after a reconnect
    assert engine.entry_count == 3
    assert sample("mqstore_index_keys_indexed_total") == keys_before + 3
    assert sink.applied_offset == 150
    assert sample("mqstore_index_dispatch_behind_bytes") == 0


def test_a_handshake_from_another_store_drops_the_index(engine: IndexEngine) -> None:
    sink = IndexSink(engine)
    sink.on_handshake(STORE_ID, 0, 100, 100, ONE_EPOCH)
    sink.on_batch([entry(0), entry(50)], 100)
    sink.on_handshake(OTHER_STORE_ID, 0, 0, 0, ONE_EPOCH)
    assert (sink.store_id, sink.applied_offset, engine.entry_count) == (OTHER_STORE_ID, 0, 0)


def test_a_handshake_below_what_was_applied_cuts_the_lost_tail(engine: IndexEngine) -> None:
    sink = IndexSink(engine)
    sink.on_handshake(STORE_ID, 0, 150, 150, ONE_EPOCH)
    sink.on_batch([entry(0), entry(50), entry(100)], 150)
    sink.on_handshake(STORE_ID, 0, 50, 50, ONE_EPOCH)  # the log lost its dirty tail in recovery
    assert sink.applied_offset == 50
    assert engine.query("T", "k", 0, 1 << 62, 10) == [0]


def test_the_idle_flusher_confirms_what_was_applied_without_another_batch(
    engine: IndexEngine,
) -> None:
    sink = IndexSink(engine)
    sink.on_handshake(STORE_ID, 0, 0, 0, ONE_EPOCH)
    confirmed_before = engine.confirmed_offset
    sink.on_batch([entry(0), entry(50)], 100)
    flusher = Flusher(engine)
    flusher.start()
    try:
        assert wait_until(lambda: engine.confirmed_offset == 100, 10)
        assert confirmed_before < 100
        assert flusher.alive
    finally:
        flusher.stop()


def test_a_failed_flush_stops_the_flusher_and_the_engine_for_good() -> None:
    sim, clock = SimDisk(), ManualClock()
    config = IndexConfig.for_tests("/data/ix", flush_interval_ms=20)
    engine = IndexEngine(config, disk=sim, clock=clock)
    engine.open()
    sink = IndexSink(engine)
    sink.on_handshake(STORE_ID, 0, 0, 0, ONE_EPOCH)
    sink.on_batch([entry(0)], 50)  # creates the first file, which is flushed at once
    assert engine.confirmed_offset == 50
    failures_before = sample("mqstore_index_flush_failures_total")
    sim.inject("flush", errno.EIO, times=100, path_contains="/data/ix/index/")
    flusher = Flusher(engine)
    flusher.start()
    try:
        sink.on_batch([entry(50)], 100)  # too soon to flush after this batch
        assert flusher.alive and engine.failure is None
        clock.advance(20)  # now the flusher's tick flushes, and fails
        assert wait_until(lambda: not flusher.alive, 10)
        assert engine.failure is not None
        assert engine.confirmed_offset == 50
        assert sample("mqstore_index_flush_failures_total") == failures_before + 1
        with pytest.raises(Exception, match="writes stopped"):
            sink.on_batch([entry(100)], 150)
    finally:
        flusher.stop()
        engine.close()
