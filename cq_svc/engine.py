"""The consume-queue engine: a store (file or RocksDB), consumer groups, acks, one flush thread.

    engine = CqEngine(config)            # nothing touched yet
    engine.open()                        # recover the store, load group offsets
    engine.handshake(store_id, min, max) # the start-up handshake (DESIGN.md)
    engine.apply(entries, batch_end)     # dispatch batches, in order
    engine.close()                       # flush, checkpoint, fold journals

The flush thread, every `flush_interval_ms`:

    what                         when
    store.flush(least_pages)     every round (least 0 every flush_thorough_interval_ms, which
                                 also advances the confirmed offset)
    acks and offsets sync        every round under `ack_flush: async`
    fold idle ack queues         every round (those idle past ack_idle_ms)

A flush that raises stops the thread and is kept in `failure`: writes are then refused (the
environment failed; restart and recovery are the way out, never a retried fsync).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cq_svc.acks import AckManager, Delivery
from cq_svc.config import AckFlush, CqConfig, StoreKind
from cq_svc.file_store import FileCqStore
from cq_svc.group_offsets import GroupOffsets
from cq_svc.store import CqStore, PullResult, RecoveryReport
from cq_svc.time_file import Boundary
from cq_svc.unit_file import Unit
from mqstore.dispatch import DispatchEntry
from mqstore.errors import Unavailable
from mqstore.storage.clock import Clock, SystemClock
from mqstore.storage.disk import Disk, OsDisk

log = logging.getLogger(__name__)


def make_store(
    config: CqConfig, *, disk: Disk | None = None, clock: Clock | None = None
) -> CqStore:
    if config.cq_store is StoreKind.ROCKSDB:
        from cq_svc.rocks_store import RocksCqStore  # noqa: PLC0415 (rocksdict only if chosen)

        return RocksCqStore(config, disk=disk, clock=clock)
    return FileCqStore(config, disk=disk, clock=clock)


@dataclass(frozen=True, slots=True)
class HandshakeAction:
    action: str  # "rebuild", "truncate", "correct_min", "none" (possibly several, joined by +)
    resume_from: int  # where dispatch should start


@dataclass(frozen=True, slots=True)
class Received:
    delivery: Delivery
    unit: Unit


class CqEngine:
    def __init__(
        self, config: CqConfig, *, disk: Disk | None = None, clock: Clock | None = None
    ) -> None:
        self.config = config
        self.disk: Disk = disk if disk is not None else OsDisk()
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.store: CqStore = make_store(config, disk=self.disk, clock=self.clock)
        groups_root = os.path.join(config.data_dir, "groups")
        sync = config.ack_flush is AckFlush.SYNC
        self.offsets = GroupOffsets(
            self.disk, groups_root, sync=sync, records_max=config.offsets_log_records_max
        )
        self.acks = AckManager(self.disk, os.path.join(groups_root, "acks"), config, self.clock)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.failure: BaseException | None = None

    # -- life cycle -----------------------------------------------------------------------------

    def open(self, *, flush_thread: bool = True) -> RecoveryReport:
        report = self.store.open()
        self.offsets.open()
        if flush_thread:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="cq-flush", daemon=True)
            self._thread.start()
        return report

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.acks.close()
        self.offsets.close()
        self.store.close()

    def _run(self) -> None:
        interval_s = self.config.flush_interval_ms / 1000.0
        next_thorough = self.clock.monotonic_ms() + self.config.flush_thorough_interval_ms
        try:
            while not self._stop.wait(interval_s):
                now = self.clock.monotonic_ms()
                least = self.config.flush_least_pages
                if now >= next_thorough:
                    least = 0
                    next_thorough = now + self.config.flush_thorough_interval_ms
                self.store.flush(least)
                if self.config.ack_flush is AckFlush.ASYNC:
                    self.acks.sync_all()
                    self.offsets.sync()
                self.acks.fold_idle()
        except Exception as exc:
            log.critical("consume-queue flush failed; writes stop until restart: %r", exc)
            self.failure = exc

    # -- the start-up handshake -----------------------------------------------------------------

    def handshake(self, store_id: bytes, min_offset: int, max_offset: int) -> HandshakeAction:
        """Bring the store into agreement with the commit log (DESIGN.md step 3)."""
        actions = []
        if self.store.store_id != store_id:
            self.store.reset(store_id)
            actions.append("rebuild")
        confirmed = self.store.confirmed_offset
        if confirmed > max_offset:
            self.store.truncate_dirty(max_offset)
            actions.append("truncate")
        if self.store.confirmed_offset < min_offset or actions == ["rebuild"]:
            self.store.delete_expired(min_offset)
            actions.append("correct_min")
        else:
            self.store.correct_min_offset(min_offset)
        resume = max(min(self.store.confirmed_offset, max_offset), min_offset)
        return HandshakeAction("+".join(actions) or "none", resume)

    # -- dispatch -------------------------------------------------------------------------------

    def apply(self, entries: Sequence[DispatchEntry], batch_end_offset: int = -1) -> int:
        if self.failure is not None:
            raise Unavailable(f"a flush failed ({self.failure!r}); restart to recover")
        return self.store.put_batch(entries, batch_end_offset)

    # -- reads ----------------------------------------------------------------------------------

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        max_bytes: int = 4 << 20,
        tags_codes: Iterable[int] = (),
    ) -> PullResult:
        return self.store.pull(topic, queue_id, offset, max_messages, max_bytes, tags_codes)

    def offset_for_time(
        self, topic: str, queue_id: int, timestamp_ms: int, boundary: Boundary = Boundary.LOWER
    ) -> int:
        return self.store.get_offset_by_time(topic, queue_id, timestamp_ms, boundary)

    # -- groups ---------------------------------------------------------------------------------

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.offsets.commit(group, topic, queue_id, offset)

    def fetch_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset: with receive/ack state, the lowest offset not acked;
        otherwise the last CommitOffset; -1 if neither."""
        key = (group, topic, queue_id)
        if self.acks.has_state(key):
            return self.acks.committed_offset(key)
        return self.offsets.get(group, topic, queue_id)

    def receive(
        self, group: str, topic: str, queue_id: int, max_count: int, invisible_ms: int
    ) -> list[Received]:
        key = (group, topic, queue_id)
        lo = self.store.min_offset(topic, queue_id)
        hi = self.store.max_offset(topic, queue_id)
        start = self.offsets.get(group, topic, queue_id)
        deliveries = self.acks.receive(
            key,
            start_offset=max(start, lo),
            max_count=max_count,
            invisible_ms=invisible_ms,
            queue_min=lo,
            queue_max=hi,
        )
        out = []
        nothing = []  # blank units point at no message: settled at once
        for d in deliveries:
            units = self.store.read_units(topic, queue_id, d.queue_offset, 1)
            if units and units[0].queue_offset == d.queue_offset and not units[0].is_blank:
                out.append(Received(d, units[0]))
            else:
                nothing.append((d.queue_offset, d.delivery_count))
        if nothing:
            self.acks.ack(key, nothing)
        return out

    def ack(self, group: str, topic: str, queue_id: int, receipts: list[tuple[int, int]]) -> int:
        return self.acks.ack((group, topic, queue_id), receipts)

    def change_invisible_duration(
        self, group: str, topic: str, queue_id: int, offset: int, delivery_count: int, ms: int
    ) -> Delivery:
        return self.acks.change_invisible((group, topic, queue_id), offset, delivery_count, ms)
