"""The consume-queue engine: a store (file or RocksDB), consumer groups, acks, one flush thread.

    engine = CqEngine(config)            # nothing touched yet
    engine.open()                        # recover the store, load group offsets
    engine.handshake(store_id, min, truncate, history)  # the start-up handshake (DESIGN.md)
    engine.apply_columns(columns, end)   # dispatch frames as columns, in order
    engine.close()                       # flush, checkpoint, fold journals

The flush thread, every `flush_interval_ms`:

    what                         when
    store.flush(least_pages)     every round (least 0 every flush_thorough_interval_ms, which
                                 also advances the confirmed offset)
    acks and offsets sync        every round under `ack_flush: async`
    fold idle ack queues         every round (those idle past ack_idle_ms)

A flush that raises stops the thread and is kept in `failure`: writes are then refused (the
environment failed; restart and recovery are the way out, never a retried fsync).

Files of the engine itself, beside the store's:

    {data_dir}/cq.lock   flock'd while open: a second process on the same directory is refused
    {data_dir}/cq.abort  present while open; removed by a close that flushed everything, so its
                         presence at open means the last run did not end cleanly (logged and
                         reported; recovery is the same either way: units at or beyond the
                         checkpoint's confirmed offset are cut and replayed from the log)

    {data_dir}/epochs    the log's history as of the last handshake: the epochs of what the
                         store holds (mqstore/history.py); written after the handshake's
                         truncation is durable, so it never claims a unit the log cut

(Named cq.* so that a data directory shared with commitlog_svc's lock and abort files is safe.)
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from cq_svc.acks import AckManager, Delivery
from cq_svc.config import AckFlush, CqConfig, StoreKind
from cq_svc.file_store import FileCqStore
from cq_svc.group_offsets import GroupKey, GroupOffsets
from cq_svc.store import CqStore, RecoveryReport
from mqstore.dispatch import DispatchColumns
from mqstore.errors import Unavailable
from mqstore.formats.cq_unit import Unit
from mqstore.group_lag import queue_lag
from mqstore.history import LogHistory
from mqstore.storage.clock import Clock, SystemClock
from mqstore.storage.disk import Disk, FileLock, OsDisk
from mqstore.storage.epoch_store import EpochStore

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
        self._file_lock: FileLock | None = None
        self.failure: BaseException | None = None
        self.unclean_start = False  # the abort marker was there at open
        self._epochs = EpochStore(self.disk, config.data_dir)
        self.history = LogHistory()  # of what the store holds; loaded at open

    # -- life cycle -----------------------------------------------------------------------------

    @property
    def _abort_path(self) -> str:
        return os.path.join(self.config.data_dir, "cq.abort")

    def open(self, *, flush_thread: bool = True) -> RecoveryReport:
        self.disk.makedirs(self.config.data_dir)
        self._file_lock = self.disk.lock(os.path.join(self.config.data_dir, "cq.lock"))
        try:
            self.unclean_start = self.disk.exists(self._abort_path)
            if self.unclean_start:
                log.warning("consume queues were not closed cleanly: recovering")
            report = self.store.open()
            self.history = self._epochs.load_follower(self.store.store_id)
            self.offsets.open()
            self.disk.write(self._abort_path, b"")
            self.disk.fsync_dir(self.config.data_dir)
        except BaseException:
            self._file_lock.release()
            self._file_lock = None
            raise
        if flush_thread:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="cq-flush", daemon=True)
            self._thread.start()
        return report

    def close(self) -> None:
        """Stop the flush thread, flush and checkpoint everything; the abort marker goes only
        when all of that succeeded (and never after a failed flush)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            self.acks.close()
            self.offsets.close()
            # After a failed flush no retried one may write a checkpoint (fsyncgate): the next
            # start recovers from the last good checkpoint and replays the rest from the log.
            self.store.close(flush=self.failure is None)
            if self.failure is None and self.disk.exists(self._abort_path):
                self.disk.remove(self._abort_path)
                self.disk.fsync_dir(self.config.data_dir)
        finally:
            if self._file_lock is not None:
                self._file_lock.release()
                self._file_lock = None

    @property
    def healthy(self) -> bool:
        """No flush failed and the flush thread (when started) is running."""
        if self.failure is not None:
            return False
        return self._thread is None or self._thread.is_alive()

    def flush(self) -> int:
        """Flush everything and checkpoint now (the flush thread's thorough round, e.g. before
        a last Confirm at shutdown); returns the confirmed offset."""
        if self.failure is not None:
            raise Unavailable(f"a flush failed ({self.failure!r}); restart to recover")
        try:
            self.acks.sync_all()
            self.offsets.sync()
            return self.store.flush(0)
        except Exception as exc:
            log.critical("consume-queue flush failed; writes stop until restart: %r", exc)
            self.failure = exc  # as in the flush thread: no retry will vouch for it later
            raise

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

    def handshake(
        self,
        store_id: bytes,
        min_offset: int,
        truncate_offset: int,
        history: LogHistory | None = None,
    ) -> HandshakeAction:
        """Bring the store into agreement with the commit log (DESIGN.md step 3).

            another store id                  drop everything, follow the new log from its
                                              minimum
            applied offset > truncate_offset  the log's history and ours part there (a
                                              recovery cut the log; what follows may be other
                                              bytes at the same offsets): cut units at or
                                              beyond it
            applied offset < min_offset       segments expired: delete what points below it
            otherwise                         correct minimum offsets

        Then the log's history (when given) becomes ours, durably, once the cut is (a crash in
        between leaves the old history over fewer units, which only replays more).

        The applied offset decides, not the confirmed one: a subscriber that reconnects
        without restarting may have applied (but not yet flushed) entries past the confirmed
        offset, and those at or past truncate_offset are not the log's any more."""
        actions = []
        if self.store.store_id != store_id:
            self.store.reset(store_id)
            actions.append("rebuild")
        if self.store.applied_offset > truncate_offset:
            self.store.truncate_dirty(truncate_offset)
            actions.append("truncate")
        if self.store.applied_offset < min_offset or actions == ["rebuild"]:
            self.store.delete_expired(min_offset)
            actions.append("correct_min")
        else:
            self.store.correct_min_offset(min_offset)
        if history is not None and history != self.history:
            self._epochs.save(store_id, history)
            self.history = history
        # Nothing below the minimum will ever be sent: without this a subscriber whose log
        # expired everything it had (and holds nothing new) would never count as caught up.
        self.store.advance_applied(min_offset)
        resume = max(min(self.store.confirmed_offset, truncate_offset), min_offset)
        return HandshakeAction("+".join(actions) or "none", resume)

    def expire(self, min_offset: int) -> int:
        """The log deleted segments below `min_offset` while the stream ran (RocketMQ's
        CleanConsumeQueueService): correct minimum offsets and delete what points below it.
        Returns the files/ranges deleted."""
        if self.failure is not None:
            raise Unavailable(f"a flush failed ({self.failure!r}); restart to recover")
        return self.store.delete_expired(min_offset)

    # -- dispatch -------------------------------------------------------------------------------

    def apply_columns(self, columns: DispatchColumns, batch_end_offset: int = -1) -> int:
        if self.failure is not None:
            raise Unavailable(f"a flush failed ({self.failure!r}); restart to recover")
        return self.store.put_columns(columns, batch_end_offset)

    # -- groups ---------------------------------------------------------------------------------

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Set the group's committed offset. A queue the group also consumes by receive/ack
        moves with it (below: settled; above: not delivered yet), so that FetchOffset
        answers what was committed."""
        key = (group, topic, queue_id)
        if self.acks.has_state(key):
            self.acks.reset(key, offset)
        self.offsets.commit(group, topic, queue_id, offset)

    def fetch_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset: with receive/ack state, the lowest offset not acked;
        otherwise the last CommitOffset; -1 if neither."""
        key = (group, topic, queue_id)
        if self.acks.has_state(key):
            return self.acks.committed_offset(key)
        return self.offsets.get(group, topic, queue_id)

    def group_offsets(self, group: str | None = None) -> list[tuple[GroupKey, int]]:
        """Every committed offset (as fetch_offset answers it), sorted; `group`: its only."""
        keys = set(self.offsets.items()) | set(self.acks.keys())
        if group is not None:
            keys = {k for k in keys if k[0] == group}
        return [(k, self.fetch_offset(*k)) for k in sorted(keys)]

    def group_lags(self) -> Iterator[tuple[str, str, int, int]]:
        """(group, topic, queue, messages not consumed) on every queue of every topic a group
        committed on, by the rule `mqstore groups` shows (mqstore/group_lag.py): for the
        metrics (mqstore_cq_group_lag_messages)."""
        committed: dict[tuple[str, str], dict[int, int]] = {}
        for (group, topic, queue_id), offset in self.group_offsets():
            committed.setdefault((group, topic), {})[queue_id] = offset
        for (group, topic), offsets in committed.items():
            for queue_id in self.store.list_queues(topic):
                yield (
                    group,
                    topic,
                    queue_id,
                    queue_lag(
                        offsets.get(queue_id),
                        self.store.min_offset(topic, queue_id),
                        self.store.max_offset(topic, queue_id),
                    ),
                )

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
            self.acks.ack(key, nothing)  # delivered just now: never stale
        return out
