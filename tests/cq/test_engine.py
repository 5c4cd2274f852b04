"""The engine: the start-up handshake of DESIGN.md, and the flush thread's checkpoint."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cq_svc.config import CqConfig, StoreKind
from cq_svc.engine import CqEngine
from tests.cq.support import entries


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
    engine.apply(entries(30))
    engine.store.flush()
    action = engine.handshake(b"B" * 16, 500, 9000)
    assert action.action.startswith("rebuild")
    assert action.resume_from == 500
    assert engine.store.max_offset("T", 0) == 0
    engine.close()


def test_a_log_that_lost_its_tail_truncates_the_queues(tmp_path: Path, kind: StoreKind) -> None:
    engine = make(tmp_path, kind)
    engine.handshake(b"A" * 16, 0, 0)
    engine.apply(entries(30))
    assert engine.store.flush() == 3000
    engine.close()
    engine = make(tmp_path, kind)
    action = engine.handshake(b"A" * 16, 0, 2000)
    assert action.action == "truncate"
    assert action.resume_from == 2000
    assert engine.store.max_offset("T", 0) == 20
    assert engine.store.confirmed_offset == 2000
    engine.apply(entries(15, start=20, phy_base=0))
    assert engine.store.max_offset("T", 0) == 35
    engine.close()


def test_a_log_whose_segments_expired_corrects_the_minimum(tmp_path: Path, kind: StoreKind) -> None:
    engine = make(tmp_path, kind)
    engine.handshake(b"A" * 16, 0, 0)
    engine.apply(entries(30))
    engine.store.flush()
    action = engine.handshake(b"A" * 16, 5000, 9000)
    assert action.action == "correct_min"
    assert action.resume_from == 5000
    assert engine.store.min_offset("T", 0) == 30
    engine.close()


def test_the_flush_thread_advances_the_confirmed_offset(tmp_path: Path, kind: StoreKind) -> None:
    engine = CqEngine(CqConfig.for_tests(str(tmp_path / "cq"), cq_store=kind))
    engine.open()
    engine.apply(entries(10))
    deadline = time.monotonic() + 10
    while engine.store.confirmed_offset < 1000 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.store.confirmed_offset == 1000
    engine.close()
