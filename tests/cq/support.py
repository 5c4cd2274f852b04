"""Helpers for the consume-queue tests: a store harness and entry builders."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from cq_svc.config import CqConfig, StoreKind
from cq_svc.engine import CqEngine, make_store
from cq_svc.errors import ReceiptExpired
from cq_svc.store import CqStore
from mqstore.dispatch import DispatchColumns, DispatchEntry
from mqstore.formats.cq_unit import UNIT


class StoreHarness:
    def __init__(self, kind: StoreKind, data_dir: Path, **overrides: object) -> None:
        self.kind = kind
        self.config = CqConfig.for_tests(str(data_dir), cq_store=kind, **overrides)
        self.store: CqStore = make_store(self.config)
        self.store.open()

    def reopen(self) -> CqStore:
        self.store.close()
        self.store = make_store(self.config)
        self.store.open()
        return self.store

    def close(self) -> None:
        self.store.close()


def entries(
    n: int,
    *,
    topic: str = "T",
    queue_id: int = 0,
    start: int = 0,
    phy_step: int = 100,
    phy_base: int = 0,
    size: int = 100,
    time_base: int = 0,
    time_step: int = 10,
    tags_code: int = 0,
) -> list[DispatchEntry]:
    """Units start..start+n-1 of one queue: unit i at phy phy_base + phy_step*i, stored at
    time_base + time_step*i."""
    return [
        DispatchEntry(
            topic=topic,
            queue_id=queue_id,
            queue_offset=i,
            commit_log_offset=phy_base + phy_step * i,
            size=size,
            tags_code=tags_code,
            store_timestamp_ms=time_base + time_step * i,
        )
        for i in range(start, start + n)
    ]


def phys(units: Sequence[object]) -> list[int]:
    return [u.commit_log_offset for u in units]  # type: ignore[attr-defined]


def encode_units(units: Iterable[tuple[int, int, int]]) -> bytes:
    """(phy, size, tags_code) triples as consume-queue units, back to back."""
    return b"".join(UNIT.pack(p, s, t) for p, s, t in units)


def apply(engine: CqEngine, batch: Sequence[DispatchEntry]) -> int:
    """CqEngine.apply_columns for an entry list."""
    return engine.apply_columns(DispatchColumns.from_entries(batch))


def last_offset(store: CqStore, topic: str, queue_id: int) -> int:
    """Commit-log end of the queue's newest unit (RocketMQ's maxPhysicOffset), or -1."""
    bounds = store._bounds((topic, queue_id))
    if bounds is None or bounds[1] <= bounds[0]:
        return -1
    return bounds[2]


def ack(
    engine: CqEngine, group: str, topic: str, queue_id: int, receipts: list[tuple[int, int]]
) -> int:
    """AckManager.ack, raising ReceiptExpired for the first stale receipt (after every
    current one is acknowledged); returns the committed offset after."""
    committed, stale = engine.acks.ack((group, topic, queue_id), receipts)
    if stale:
        offset, count = stale[0]
        raise ReceiptExpired(group, topic, queue_id, offset, f"delivery {count} is stale")
    return committed
