"""The file consume-queue store: every (topic, queueId) as unit files plus time companions.

    {data_dir}/consumequeue/{topic}/{queueId}/{20-digit byte offset}       unit_file.py
    {data_dir}/consumequeue_time/{topic}/{queueId}/{20-digit byte offset}  time_file.py
    {data_dir}/cq_checkpoint                                               checkpoint.py

Many queues: a `QueueState` (a few ints) is kept for every queue; the mapped files of a queue
are opened on first use and closed again by an LRU bounded by `open_maps_max` (every map holds
a file descriptor). An evicted queue is not flushed then (that would cost an msync per batch
under a round-robin dispatch); it is remembered, and the next full flush maps it alone, msyncs
what it had not flushed and unmaps it again, before the checkpoint vouches for it. One queue
with more files than the bound stays open alone (the bound is then exceeded by that queue).

One lock serialises every operation: a pull or lookup is tens of microseconds of work. The
flush thread holds it for a whole flush round, so a thorough flush of many dirty queues delays
pulls for its duration (a finer lock per queue is the next step if that shows).

Open: load the checkpoint (confirmed offset C, the log's last known minimum), recover every
queue (queue_files.py's table: units at or beyond C are cut), then correct min offsets.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

from cq_svc import checkpoint
from cq_svc.config import CqConfig
from cq_svc.queue_files import FileQueue, QueueState
from cq_svc.store import (
    CqStore,
    Key,
    RecoveryReport,
    UnitRun,
    check_gap,
    check_queue_name,
)
from mqstore.dispatch import DispatchColumns, DispatchEntry
from mqstore.errors import check
from mqstore.formats.cq_checkpoint import CqCheckpoint
from mqstore.formats.cq_time import Boundary, clamp_time, search_offset_by_time
from mqstore.formats.cq_unit import UNIT_BYTES, Unit
from mqstore.storage import failpoints
from mqstore.storage.clock import Clock
from mqstore.storage.disk import Disk

log = logging.getLogger(__name__)

_FRESH = QueueState()  # what a queue not seen before starts from (never written to)


class FileCqStore(CqStore):
    def __init__(
        self, config: CqConfig, *, disk: Disk | None = None, clock: Clock | None = None
    ) -> None:
        super().__init__(config, disk=disk, clock=clock)
        self._states: dict[Key, QueueState] = {}
        self._open: OrderedDict[Key, FileQueue] = OrderedDict()
        self._open_maps = 0
        self._unflushed: set[Key] = set()  # evicted while dirty (flushed at the checkpoint)
        self._opened = False

    # -- life cycle -----------------------------------------------------------------------------

    def open(self) -> RecoveryReport:
        started = time.monotonic()
        with self._lock:
            check(not self._opened, "store opened twice")
            self.disk.makedirs(self.config.data_dir)
            self._ckpt = checkpoint.load(self.disk, self.config.data_dir)
            self._applied = self._ckpt.confirmed_offset
            self._min_phy = self._ckpt.min_commit_log_offset
            report = RecoveryReport(confirmed_offset=self._ckpt.confirmed_offset)
            now = self.clock.now_ms()
            for key in self._discover():
                state = QueueState()
                fq = self._new_queue(key, state)
                report.units_cut += fq.recover(self._ckpt.confirmed_offset, now)
                fq.correct_min_offset(self._min_phy)
                fq.close()
                self._states[key] = state
                report.queues += 1
            self._opened = True
        report.duration_ms = (time.monotonic() - started) * 1000
        log.info(
            "file consume queues open: %d queues, %d units cut, confirmed offset %d, %.1f ms",
            report.queues,
            report.units_cut,
            report.confirmed_offset,
            report.duration_ms,
        )
        return report

    def _discover(self) -> list[Key]:
        root = f"{self.config.data_dir}/consumequeue"
        keys = []
        for topic in self.disk.listdir(root):
            for qid in self.disk.listdir(f"{root}/{topic}"):
                if qid.lstrip("-").isdigit():
                    keys.append((topic, int(qid)))
        return keys

    def close(self, *, flush: bool = True) -> None:
        with self._lock:
            if not self._opened:
                return
            if flush:
                self.flush(0)
            for fq in self._open.values():
                fq.close(flush=flush)
            self._open.clear()
            self._open_maps = 0
            self._opened = False

    @property
    def confirmed_offset(self) -> int:
        return self._ckpt.confirmed_offset

    def advance_applied(self, offset: int) -> None:
        """Nothing below `offset` will ever be dispatched (the log's minimum): count it as
        applied, so the next checkpoint confirms it."""
        with self._lock:
            self._applied = max(self._applied, offset)

    def reset(self, store_id: bytes) -> None:
        with self._lock:
            for fq in self._open.values():
                fq.close()
            self._open.clear()
            self._open_maps = 0
            self._unflushed.clear()
            self._states.clear()
            for tree in ("consumequeue", "consumequeue_time"):
                self.disk.remove_tree(f"{self.config.data_dir}/{tree}")
            self._applied = 0
            self._min_phy = 0
            self._ckpt = CqCheckpoint(store_id=store_id)
            self._save_checkpoint(0)

    # -- queues and the LRU ---------------------------------------------------------------------

    def _new_queue(self, key: Key, state: QueueState) -> FileQueue:
        topic, qid = key
        return FileQueue(
            self.disk, self.config.data_dir, topic, qid, self.config.units_per_file, state
        )

    def _queue(self, key: Key, *, create: bool) -> FileQueue | None:
        fq = self._open.get(key)
        if fq is not None:
            self._open.move_to_end(key)
            return fq
        state = self._states.get(key)
        if state is None:
            if not create:
                return None
            check_queue_name(key)
            state = QueueState()
            self._states[key] = state
            fq = self._new_queue(key, state)
        else:
            fq = self._new_queue(key, state)
            fq.reopen()
        self._open[key] = fq
        self._open_maps += fq.map_count
        self._evict(keep=key)
        return fq

    def _evict(self, keep: Key) -> None:
        while self._open_maps > self.config.open_maps_max and len(self._open) > 1:
            key, fq = next(iter(self._open.items()))
            if key == keep:
                self._open.move_to_end(key)
                continue
            del self._open[key]
            self._open_maps -= fq.map_count
            # No msync here: an eviction per batch would cost a flush per batch. The pages
            # stay dirty in the page cache until the checkpoint flush.
            if fq.dirty:
                self._unflushed.add(key)
            fq.close(flush=not fq.dirty)

    def _recount(self, fq: FileQueue, before: int) -> None:
        self._open_maps += fq.map_count - before

    # -- writes ---------------------------------------------------------------------------------

    def put_columns(self, columns: DispatchColumns, batch_end_offset: int = -1) -> int:
        """The core packs every queue's run of the frame in one call (CqStore._pack_runs), and
        each run is appended to its queue (one write per file it touches); a run that is not
        plain (a gap, a replay that overlaps the queue's end) goes entry by entry through
        `_apply`, the reference tests/cq/test_apply_columns.py pins the packing to."""
        end = columns.end_offset(batch_end_offset)
        runs = columns.queue_runs()
        written = 0
        with self._lock:
            states = [self._states.get(key, _FRESH) for key in runs.keys]
            ends, units, times = self._pack_runs(columns, runs, states)
            for r, key in enumerate(runs.keys):
                start, _, _, last_phy, last_size, last_time = ends[r]
                fq = self._queue(key, create=True)
                assert fq is not None
                before = fq.map_count
                if start < 0:
                    written += self._apply(fq, [columns[i] for i in runs.run(r).tolist()])
                elif units[r]:
                    fq.append_packed(units[r], times[r], last_phy, last_size, last_time)
                    written += len(units[r]) // UNIT_BYTES
                self._recount(fq, before)
                self._evict(keep=key)
            self._applied = max(self._applied, end)
        failpoints.hit("cq.after_put")
        return written

    def _apply(self, fq: FileQueue, group: list[DispatchEntry]) -> int:
        st = fq.state
        rows: list[tuple[int, int, int, int]] = []
        expect = st.max_offset
        last_end = st.last_phy_end
        last_time = st.last_time_ms
        written = 0
        for e in group:
            if e.end_offset <= last_end or e.queue_offset < expect:
                continue  # applied before ("Build consume queue repeatedly")
            if e.queue_offset > expect:
                written += len(rows)
                if rows:
                    fq.append(rows)
                    rows = []
                self._fill_gap(fq, e.queue_offset)
                expect = st.max_offset
            last_time = max(last_time, clamp_time(e.store_timestamp_ms))
            rows.append((e.commit_log_offset, e.size, e.tags_code, last_time))
            last_end = e.end_offset
            expect += 1
        if rows:
            fq.append(rows)
            written += len(rows)
        return written

    def _fill_gap(self, fq: FileQueue, offset: int) -> None:
        if not fq.units.files:
            fq.start_at(offset)
            return
        key = (fq.topic, fq.queue_id)
        check_gap(key, fq.state.max_offset, offset, self.config.units_per_file)
        fq.fill_blanks_to(offset)

    def truncate_dirty(self, phy_offset: int) -> int:
        dropped = 0
        with self._lock:
            for key, state in list(self._states.items()):
                if state.max_offset == 0:
                    state.last_phy_end = -1
                    continue
                if 0 <= state.last_phy_end <= phy_offset:
                    continue
                fq = self._queue(key, create=False)
                assert fq is not None
                before = fq.map_count
                dropped += fq.truncate_dirty(phy_offset)
                self._recount(fq, before)
            self._applied = min(self._applied, phy_offset)
            if self._ckpt.confirmed_offset > phy_offset:
                self._save_checkpoint(phy_offset)
        return dropped

    def correct_min_offset(self, min_commit_log_offset: int) -> None:
        with self._lock:
            self._min_phy = max(self._min_phy, min_commit_log_offset)
            for key, state in list(self._states.items()):
                if state.min_offset >= state.max_offset:
                    continue
                fq = self._queue(key, create=False)
                assert fq is not None
                fq.correct_min_offset(min_commit_log_offset)

    def delete_expired(self, min_commit_log_offset: int) -> int:
        deleted = 0
        with self._lock:
            self._min_phy = max(self._min_phy, min_commit_log_offset)
            for key in list(self._states):
                fq = self._queue(key, create=False)
                assert fq is not None
                before = fq.map_count
                deleted += fq.delete_expired(min_commit_log_offset)
                self._recount(fq, before)
        return deleted

    def flush(self, least_pages: int = 0) -> int:
        """Flush open queues; with least_pages 0, everything, then the checkpoint."""
        with self._lock:
            applied = self._applied
            for fq in self._open.values():
                if fq.dirty:
                    fq.flush(least_pages)
            if least_pages == 0:
                for key in sorted(self._unflushed):
                    if key not in self._open and key in self._states:
                        # Mapped alone and unmapped at once: outside the LRU, within its bound.
                        fq = self._new_queue(key, self._states[key])
                        fq.reopen()
                        fq.close(flush=True)
                self._unflushed.clear()
            if least_pages == 0 and applied != self._ckpt.confirmed_offset:
                self._save_checkpoint(applied)
            return self._ckpt.confirmed_offset

    # -- reads ----------------------------------------------------------------------------------

    def _bounds(self, key: Key) -> tuple[int, int, int] | None:
        st = self._states.get(key)  # no lock: a flush round holds it, and these are ints
        return (st.min_offset, st.max_offset, st.last_phy_end) if st is not None else None

    def read_units(self, topic: str, queue_id: int, offset: int, max_units: int) -> list[Unit]:
        with self._lock:
            fq = self._queue((topic, queue_id), create=False)
            if fq is None:
                return []
            offset = max(offset, fq.state.min_offset)
            return fq.read_units(offset, max_units) or []

    def get_offset_by_time(
        self, topic: str, queue_id: int, timestamp_ms: int, boundary: Boundary = Boundary.LOWER
    ) -> int:
        with self._lock:
            fq = self._queue((topic, queue_id), create=False)
            if fq is None:
                return 0
            st = fq.state
            lo = max(st.min_offset, fq.units.min_offset() // UNIT_BYTES if fq.units.files else 0)
            checked, raw_bisect = fq.time_readers()
            found = search_offset_by_time(
                checked, lo, st.max_offset, timestamp_ms, boundary, raw_bisect
            )
            return min(max(found, st.min_offset), st.max_offset)

    def _pull_source(self, key: Key) -> _FilePullSource:
        return _FilePullSource(self, key)

    def list_queues(self, topic: str) -> list[int]:
        return sorted(q for t, q in list(self._states) if t == topic)

    def list_topics(self) -> list[str]:
        return sorted({t for t, _ in list(self._states)})


class _FilePullSource:
    def __init__(self, store: FileCqStore, key: Key) -> None:
        self._store = store
        self._fq = store._queue(key, create=False)

    def bounds(self) -> tuple[int, int]:
        if self._fq is None:
            return 0, 0
        return self._fq.state.min_offset, self._fq.state.max_offset

    def scan(self, offset: int, max_units: int) -> UnitRun | None:
        assert self._fq is not None
        return self._fq.read_unit_run(offset, max_units)

    def roll_next(self, offset: int) -> int:
        assert self._fq is not None
        return self._fq.roll_next_file(offset)

    one_file_per_pull = True

    @property
    def units_per_file(self) -> int:
        return self._store.config.units_per_file
