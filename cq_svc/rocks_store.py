"""The RocksDB consume-queue store (config `cq_store: rocksdb`), layouts in rocks_layout.py.

    {data_dir}/cq_rocksdb/      the database (column families `default` and `offset`)
    {data_dir}/cq_checkpoint    store id and the log's last known minimum (checkpoint.py)

What differs from the file store, and why:
- A million queues are a million key ranges, not a million directories. Per-queue state (min,
  max, newest phy end and time) lives in an LRU of `rocksdb_queue_cache_max` entries; a miss
  reads the queue's max/min rows and its newest unit.
- Durability: writes go to the WAL unsynced; `flush()` syncs the WAL. The checkpoint row is in
  the same WriteBatch as the units it covers, so whatever prefix of the WAL survives a crash,
  the row and the units agree: open() takes the confirmed offset from it, and no scan is needed.
  (RocketMQ disables the WAL and flushes memtables; a synced WAL is the cheaper durable point.)
- Minimum offsets are corrected lazily: `correct_min_offset` records the log's minimum; a queue
  moves its min row the next time it is touched (RocketMQ's getMinCqOffset does the same).
- Truncation rewrites max rows only; unit rows above max stay until overwritten (§8.5).
- Expiry deletes each queue's unit rows below its corrected min with delete_range.
"""

from __future__ import annotations

import bisect
import os
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import rocksdict

from cq_svc import checkpoint
from cq_svc import rocks_layout as L  # noqa: N812 (the layout module, read as a prefix)
from cq_svc.config import CqConfig
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
from mqstore.formats.cq_unit import BLANK_SIZE, Unit
from mqstore.storage import failpoints
from mqstore.storage.clock import Clock
from mqstore.storage.disk import Disk

OFFSET_CF = "offset"
# Units read per multi-get when iterating: one round trip into RocksDB for a pull.
_RANGE_CHUNK = 1024


class _QState:
    __slots__ = (
        "last_phy_end",
        "last_time_ms",
        "max_key",
        "max_offset",
        "min_offset",
        "min_phy_seen",
        "prefix",
    )

    def __init__(self, key: Key) -> None:
        self.prefix = L.queue_prefix(*key)  # of its unit rows' keys
        self.max_key = L.offset_key(key[0], L.MAX, key[1])  # its max row's key
        self.min_offset = 0
        self.max_offset = 0
        self.last_phy_end = -1
        self.last_time_ms = 0
        self.min_phy_seen = -1  # the log minimum this state's min_offset was corrected for


class RocksCqStore(CqStore):
    def __init__(
        self, config: CqConfig, *, disk: Disk | None = None, clock: Clock | None = None
    ) -> None:
        super().__init__(config, disk=disk, clock=clock)
        self.path = os.path.join(config.data_dir, "cq_rocksdb")
        self._db: rocksdict.Rdict | None = None
        self._offset_cf: rocksdict.Rdict | None = None
        self._offset_handle: object = None
        self._cache: OrderedDict[Key, _QState] = OrderedDict()
        self._confirmed = 0

    # -- life cycle -----------------------------------------------------------------------------

    def _options(self) -> rocksdict.Options:
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        opts.set_write_buffer_size(self.config.rocksdb_write_buffer_bytes)
        opts.set_wal_recovery_mode(rocksdict.DBRecoveryMode.point_in_time())
        return opts

    def open(self) -> RecoveryReport:
        started = time.monotonic()
        with self._lock:
            check(self._db is None, "store opened twice")
            self.disk.makedirs(self.config.data_dir)
            self._ckpt = checkpoint.load(self.disk, self.config.data_dir)
            self._min_phy = self._ckpt.min_commit_log_offset
            self._open_db()
            raw = self._ocf().get(L.CHECKPOINT_KEY)
            self._applied = L.CHECKPOINT_VALUE.unpack(raw)[0] if raw is not None else 0
            self._confirmed = self._applied
        report = RecoveryReport(confirmed_offset=self._confirmed)
        report.duration_ms = (time.monotonic() - started) * 1000
        return report

    def _open_db(self) -> None:
        opts = self._options()
        cf_opts = rocksdict.Options(raw_mode=True)
        self._db = rocksdict.Rdict(self.path, options=opts, column_families={OFFSET_CF: cf_opts})
        self._offset_cf = self._db.get_column_family(OFFSET_CF)
        self._offset_handle = self._db.get_column_family_handle(OFFSET_CF)

    def close(self, *, flush: bool = True) -> None:
        with self._lock:
            if self._db is None:
                return
            if flush:
                self.flush(0)
            self._release_db()
            self._cache.clear()

    def _release_db(self) -> None:
        """Close the database. Every object holding it (the column family and its handle)
        must go first: RocksDB keeps its LOCK file until the last reference is dropped."""
        db = self._db
        self._db = None
        self._offset_cf = None
        self._offset_handle = None
        if db is not None:
            db.close()
            del db

    def _db_(self) -> rocksdict.Rdict:
        db = self._db
        check(db is not None, "store is not open")
        assert db is not None
        return db

    def _ocf(self) -> rocksdict.Rdict:
        cf = self._offset_cf
        check(cf is not None, "store is not open")
        assert cf is not None
        return cf

    @property
    def confirmed_offset(self) -> int:
        return self._confirmed

    def advance_applied(self, offset: int) -> None:
        """Nothing below `offset` will ever be dispatched (the log's minimum): count it as
        applied; the checkpoint row says so once the next flush syncs the WAL."""
        with self._lock:
            if offset <= self._applied:
                return
            wb = rocksdict.WriteBatch(raw_mode=True)
            self._put_checkpoint(wb, offset)
            self._db_().write(wb)
            self._applied = offset

    def _put_checkpoint(self, wb: rocksdict.WriteBatch, applied: int) -> None:
        handle: Any = self._offset_handle
        wb.put(L.CHECKPOINT_KEY, L.CHECKPOINT_VALUE.pack(applied), handle)

    def _put_offset(
        self, wb: rocksdict.WriteBatch, key: Key, kind: bytes, phy: int, offset: int
    ) -> None:
        """The queue's min or max row (`kind` L.MIN or L.MAX) into `wb`."""
        topic, qid = key
        handle: Any = self._offset_handle
        wb.put(L.offset_key(topic, kind, qid), L.OFFSET_VALUE.pack(phy, offset), handle)

    def reset(self, store_id: bytes) -> None:
        with self._lock:
            if self._db is not None:
                self._release_db()
            rocksdict.Rdict.destroy(self.path, self._options())
            self._cache.clear()
            self._open_db()
            self._applied = self._confirmed = 0
            self._min_phy = 0
            self._ckpt = CqCheckpoint(store_id=store_id)
            self._save_checkpoint(self._confirmed)

    # -- per-queue state ------------------------------------------------------------------------

    def _state(self, key: Key, *, create: bool) -> _QState | None:
        st = self._cache.get(key)
        if st is None:
            st = self._load_state(key)
            if st is None:
                if not create:
                    return None
                check_queue_name(key)
                st = _QState(key)
            self._cache[key] = st
            while len(self._cache) > self.config.rocksdb_queue_cache_max:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        if st.min_phy_seen < self._min_phy and st.max_offset > st.min_offset:
            self._correct_min(key, st, self._min_phy)
        return st

    def _load_state(self, key: Key) -> _QState | None:
        topic, qid = key
        keys: Any = [L.offset_key(topic, L.MAX, qid), L.offset_key(topic, L.MIN, qid)]
        raw: Any = self._ocf().get(keys)
        if raw[0] is None:
            return None
        st = _QState(key)
        st.max_offset = L.OFFSET_VALUE.unpack(raw[0])[1] + 1
        st.min_offset = L.OFFSET_VALUE.unpack(raw[1])[1] if raw[1] is not None else 0
        st.min_offset = min(st.min_offset, st.max_offset)
        last = self._unit(st, st.max_offset - 1) if st.max_offset > 0 else None
        if last is not None:
            st.last_phy_end = -1 if last.is_blank else last.end_offset
            st.last_time_ms = last.store_timestamp_ms
        return st

    def _unit(self, st: _QState, offset: int) -> Unit | None:
        raw = self._db_().get(L.unit_key(st.prefix, offset))
        if raw is None:
            return None
        return Unit(offset, *L.UNIT_VALUE.unpack(raw))

    def _values(self, st: _QState, offset: int, count: int) -> list[bytes]:
        """The unit rows' values (L.UNIT_VALUE) from `offset`, up to the first missing row."""
        out: list[bytes] = []
        db = self._db_()
        prefix = st.prefix
        while count > 0:
            n = min(count, _RANGE_CHUNK)
            keys: Any = [L.unit_key(prefix, offset + i) for i in range(n)]
            values: Any = db.get(keys)
            for raw in values:
                if raw is None:
                    return out
                out.append(raw)
            offset += n
            count -= n
        return out

    def _phy(self, st: _QState, offset: int) -> int:
        u = self._unit(st, offset)
        if u is None or u.is_blank:
            return -1
        return u.commit_log_offset

    def _first_at_or_above(self, st: _QState, lo: int, hi: int, phy_floor: int) -> int:
        return bisect.bisect_left(range(hi), phy_floor, lo, hi, key=lambda o: self._phy(st, o))

    def _correct_min(self, key: Key, st: _QState, min_phy: int) -> None:
        """getMinCqOffset's correction (§8.5), written back as the min row."""
        st.min_phy_seen = min_phy
        if st.min_offset >= st.max_offset:
            return
        if self._phy(st, st.max_offset - 1) < min_phy:
            new_min = st.max_offset
        elif self._phy(st, st.min_offset) >= min_phy:
            return
        else:
            new_min = self._first_at_or_above(st, st.min_offset, st.max_offset, min_phy)
        st.min_offset = new_min
        phy = max(self._phy(st, new_min), 0) if new_min < st.max_offset else 0
        topic, qid = key
        self._ocf().put(L.offset_key(topic, L.MIN, qid), L.OFFSET_VALUE.pack(phy, new_min))

    # -- writes ---------------------------------------------------------------------------------

    def _commit(
        self,
        wb: rocksdict.WriteBatch,
        pending: list[tuple[_QState, int, int, int, int]],
        end: int,
    ) -> None:
        """Under the lock: write the batch with the new applied offset, then move the states
        of the queues it touched (only once the write went through)."""
        end = max(end, self._applied)
        self._put_checkpoint(wb, end)
        self._db_().write(wb)
        for st, new_min, new_max, last_end, last_time in pending:
            st.min_offset, st.max_offset = new_min, new_max
            st.last_phy_end, st.last_time_ms = last_end, last_time
        self._applied = end

    def put_columns(self, columns: DispatchColumns, batch_end_offset: int = -1) -> int:
        """The core packs every queue's run of the frame, keys and values, in one call
        (CqStore._pack_runs) for the one WriteBatch; a run that is not plain (a gap, a fresh
        queue starting above 0, a replay that overlaps the queue's end) goes entry by entry
        through `_apply`, the reference tests/cq/test_apply_columns.py pins the packing to."""
        end = columns.end_offset(batch_end_offset)
        runs = columns.queue_runs()
        written = 0
        with self._lock:
            wb = rocksdict.WriteBatch(raw_mode=True)
            pending: list[tuple[_QState, int, int, int, int]] = []
            states: list[_QState] = []
            for key in runs.keys:
                st = self._state(key, create=True)
                assert st is not None
                states.append(st)
            ends, keys, values = self._pack_runs(
                columns, runs, states, [st.prefix for st in states]
            )
            offset_cf: Any = self._offset_handle
            put, pack_offset = wb.put, L.OFFSET_VALUE.pack
            for r, (key, st) in enumerate(zip(runs.keys, states, strict=True)):
                start, next_offset, first_phy, last_phy, last_size, last_time = ends[r]
                if start < 0:
                    group = [columns[i] for i in runs.run(r).tolist()]
                    n, new = self._apply(key, st, group, wb)
                    if n:
                        written += n
                        pending.append((st, *new))
                    continue
                first = st.max_offset
                if next_offset == first:
                    continue
                if first == 0 and st.min_offset == 0:
                    # A fresh queue's min row (`_apply` writes it with the queue's first unit).
                    self._put_offset(wb, key, L.MIN, first_phy, first)
                put(st.max_key, pack_offset(last_phy, next_offset - 1), offset_cf)
                pending.append((st, st.min_offset, next_offset, last_phy + last_size, last_time))
                written += next_offset - first
            for k, v in zip(keys, values, strict=True):
                put(k, v)
            self._commit(wb, pending, end)
        failpoints.hit("cq.after_put")
        return written

    def _apply(
        self, key: Key, st: _QState, group: list[DispatchEntry], wb: rocksdict.WriteBatch
    ) -> tuple[int, tuple[int, int, int, int]]:
        expect = st.max_offset
        min_offset = st.min_offset
        last_end = st.last_phy_end
        last_time = st.last_time_ms
        prefix = st.prefix
        pack = L.UNIT_VALUE.pack
        written = 0
        last_phy = -1
        fresh = st.max_offset == 0 and st.min_offset == 0
        for e in group:
            if e.end_offset <= last_end or e.queue_offset < expect:
                continue
            if e.queue_offset > expect:
                if fresh and written == 0:
                    min_offset = e.queue_offset  # initializeWithOffset: the queue starts here
                else:
                    check_gap(key, expect, e.queue_offset, self.config.units_per_file)
                    blank = pack(0, BLANK_SIZE, 0, last_time)
                    for off in range(expect, e.queue_offset):
                        wb.put(L.unit_key(prefix, off), blank)
                expect = e.queue_offset
            if fresh and written == 0:
                self._put_offset(wb, key, L.MIN, e.commit_log_offset, expect)
            last_time = max(last_time, clamp_time(e.store_timestamp_ms))
            wb.put(
                L.unit_key(prefix, expect),
                pack(e.commit_log_offset, e.size, e.tags_code, last_time),
            )
            last_end = e.end_offset
            last_phy = e.commit_log_offset
            expect += 1
            written += 1
        if written:
            self._put_offset(wb, key, L.MAX, last_phy, expect - 1)
        return written, (min_offset, expect, last_end, last_time)

    def truncate_dirty(self, phy_offset: int) -> int:
        """§8.5: lower the checkpoint row; rewrite the max row of every queue whose newest unit
        points at or beyond `phy_offset`. Unit rows above max stay until overwritten."""
        dropped = 0
        with self._lock:
            wb = rocksdict.WriteBatch(raw_mode=True)
            touched = [key for key, last_phy in self._max_rows() if last_phy >= phy_offset]
            for key in touched:
                self._cache.pop(key, None)
                st = self._load_state(key)
                assert st is not None
                cut = self._first_at_or_above(st, st.min_offset, st.max_offset, phy_offset)
                dropped += st.max_offset - cut
                last_phy = self._phy(st, cut - 1) if cut > 0 else -1
                self._put_offset(wb, key, L.MAX, last_phy, cut - 1)
                if st.min_offset > cut:
                    self._put_offset(wb, key, L.MIN, 0, cut)
            self._applied = min(self._applied, phy_offset)
            self._put_checkpoint(wb, self._applied)
            self._db_().write(wb)
            for key in touched:
                self._cache.pop(key, None)
            self._db_().flush_wal(True)
            self._confirmed = min(self._confirmed, phy_offset)
        return dropped

    def correct_min_offset(self, min_commit_log_offset: int) -> None:
        with self._lock:
            if min_commit_log_offset > self._min_phy:
                self._min_phy = min_commit_log_offset
                self._save_checkpoint(self._confirmed)

    def delete_expired(self, min_commit_log_offset: int) -> int:
        """Correct every queue's min and delete its unit rows below it; returns queues that
        lost rows."""
        self.correct_min_offset(min_commit_log_offset)
        cleaned = 0
        with self._lock:
            for key in [key for key, _ in self._max_rows()]:
                st = self._state(key, create=False)
                if st is None or st.min_offset == 0:
                    continue
                first = self._db_().iter()
                first.seek(st.prefix)
                has_old = first.valid() and first.key()[: len(st.prefix)] == st.prefix
                # The newest row always stays: it carries the queue's running maximum time and
                # newest phy end (the file store likewise never deletes its last file).
                keep_from = min(st.min_offset, st.max_offset - 1)
                if has_old and L.decode_unit_key(first.key())[2] < keep_from:
                    self._db_().delete_range(st.prefix, L.unit_key(st.prefix, keep_from))
                    cleaned += 1
                del first
        return cleaned

    def _max_rows(self) -> Iterator[tuple[Key, int]]:
        """Every queue, with the commit-log offset of its newest unit (its max row)."""
        it = self._ocf().iter()
        it.seek_to_first()
        while it.valid():
            k = it.key()
            if k != L.CHECKPOINT_KEY:
                topic, kind, qid = L.decode_offset_key(k)
                if kind == L.MAX:
                    yield (topic, qid), L.OFFSET_VALUE.unpack(it.value())[0]
            it.next()

    def flush(self, least_pages: int = 0) -> int:
        """Sync the WAL; the checkpoint row written with the newest batch becomes durable with
        it. `least_pages` > 0 (an interval flush) syncs too: a WAL sync is one fsync."""
        with self._lock:
            if self._db is None:
                return self._confirmed
            applied = self._applied
            if applied != self._confirmed:
                failpoints.hit("cq.rocks.before_sync")
                self._db.flush_wal(True)
                self._confirmed = applied
            return self._confirmed

    # -- reads ----------------------------------------------------------------------------------

    def _bounds(self, key: Key) -> tuple[int, int, int] | None:
        with self._lock:
            st = self._state(key, create=False)
            return (st.min_offset, st.max_offset, st.last_phy_end) if st is not None else None

    def read_units(self, topic: str, queue_id: int, offset: int, max_units: int) -> list[Unit]:
        with self._lock:
            st = self._state((topic, queue_id), create=False)
            if st is None:
                return []
            offset = max(offset, st.min_offset)
            values = self._values(st, offset, min(max_units, st.max_offset - offset))
            return [Unit(offset + i, *L.UNIT_VALUE.unpack(raw)) for i, raw in enumerate(values)]

    def get_offset_by_time(
        self, topic: str, queue_id: int, timestamp_ms: int, boundary: Boundary = Boundary.LOWER
    ) -> int:
        with self._lock:
            st = self._state((topic, queue_id), create=False)
            if st is None:
                return 0

            def time_at(offset: int) -> int:
                u = self._unit(st, offset)
                check(u is not None, f"{topic}/{queue_id}: no unit row at {offset}")
                assert u is not None
                return u.store_timestamp_ms

            found = search_offset_by_time(
                time_at, st.min_offset, st.max_offset, timestamp_ms, boundary
            )
            return min(max(found, st.min_offset), st.max_offset)

    def _pull_source(self, key: Key) -> _RocksPullSource:
        return _RocksPullSource(self, self._state(key, create=False))

    def list_queues(self, topic: str) -> list[int]:
        prefix = topic.encode()
        with self._lock:
            start = L.offset_key(topic, L.MAX, 0)[: 6 + len(prefix)]
            out = []
            it = self._ocf().iter()
            it.seek(start)
            while it.valid() and it.key().startswith(start):
                _, kind, qid = L.decode_offset_key(it.key())
                if kind == L.MAX:
                    out.append(qid)
                it.next()
            return sorted(out)

    def list_topics(self) -> list[str]:
        with self._lock:
            return sorted({topic for (topic, _), _ in self._max_rows()})


class _RocksPullSource:
    def __init__(self, store: RocksCqStore, st: _QState | None) -> None:
        self._store = store
        self._st = st

    def bounds(self) -> tuple[int, int]:
        st = self._st
        return (st.min_offset, st.max_offset) if st is not None else (0, 0)

    def scan(self, offset: int, max_units: int) -> UnitRun | None:
        assert self._st is not None
        values = self._store._values(self._st, offset, max_units)
        return UnitRun(offset, b"".join(values), L.UNIT_VALUE.size) if values else None

    def roll_next(self, offset: int) -> int:
        # No files to roll over: a missing row is skipped one offset at a time.
        return offset + 1

    one_file_per_pull = False
    units_per_file = 1
