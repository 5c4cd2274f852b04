"""The index engine: index_svc's storage as a library; servicer.py serves it over gRPC.

    engine = IndexEngine(config)             # nothing touched yet
    report = engine.open()                   # lock, recover; report.replay_from_offset
    start = engine.handshake(store_id, min_offset, truncate_offset, history)   # agree with the log
    engine.apply(batch)                      # each dispatch batch, in order; idempotent
    engine.apply_columns(columns)            # the same for a frame as columns (the sink's way)
    engine.confirmed_offset                  # what to send in Confirm after a flush
    engine.query(topic, key, begin, end, n)  # candidate commit-log offsets, newest first
    engine.lookup(topic, key, begin, end, n, fetch)   # candidates confirmed against records,
                                             # and their store times against [begin, end]
    engine.close()                           # flush, checkpoint as clean, unlock

What gets indexed (RocketMQ's buildIndex, §4.3): for every dispatch entry that is not a
rolled-back transaction, `topic#UNIQ_KEY` when present, then `topic#token` for every non-empty
token of KEYS split on " " (repeats are kept, as RocketMQ keeps them). With shards, only the keys
whose mqstore.sharding shard is this engine's.

Replay is harmless: the engine remembers the end of the last entry it applied (the applied
offset) and skips any entry that starts below it. Everything below the confirmed offset is
applied and flushed, and the checkpoint says so; it is written on rollover, on the flush
interval (checked after each batch and by `flush_if_due`), by `flush()` and at close.

Threads: one lock serialises applies, queries and maintenance; a query holds it for one chain
walk per file. Failures: a failed flush stops writes for good (fsync errors are not retried:
the kernel may have dropped the pages); restart and recovery are the way back. A disk too full
to create the next file refuses the whole batch (no key of it is written) with DiskFull.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from index_svc.config import IndexConfig
from index_svc.confirm import KeyedRecord, confirm_key, confirm_uniq, within
from index_svc.index_file import IndexFile
from index_svc.recovery import RecoveryReport, cut_at_offset, recover
from mqstore.dispatch import Column, DispatchColumns, DispatchEntry
from mqstore.errors import (
    CorruptFile,
    FailedPrecondition,
    FlushFailed,
    InvalidArgument,
    Unavailable,
    check,
)
from mqstore.formats import _core, keyhash
from mqstore.formats import index_file as fmt
from mqstore.formats.index_checkpoint import (
    FILE_HEAD_CRC,
    NO_STORE_ID,
    STORE_ID_BYTES,
    IndexCheckpoint,
    decode_checkpoint,
    encode_checkpoint,
)
from mqstore.formats.javahash import index_key_hash
from mqstore.formats.keyhash import message_keys
from mqstore.history import LogHistory
from mqstore.sharding import index_key, key_hash64, shard_of_hash
from mqstore.storage import failpoints
from mqstore.storage.clock import Clock, SystemClock
from mqstore.storage.disk import Disk, FileLock, OsDisk, write_atomic
from mqstore.storage.epoch_store import EpochStore

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint"
LOCK_FILE = "lock"
TIME_MAX_MS = (1 << 63) - 1
# An entry keeps its store time in whole seconds from its file's begin (RocketMQ's layout): the
# time read back lies up to this much less one below the true one.
ENTRY_TIME_UNIT_MS = 1_000

Fetch = Callable[[Sequence[int]], Mapping[int, KeyedRecord]]


class IndexEngine:
    def __init__(
        self, config: IndexConfig, *, disk: Disk | None = None, clock: Clock | None = None
    ) -> None:
        self.config = config
        self.disk: Disk = disk if disk is not None else OsDisk()
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._dir = config.index_dir
        self._ckpt_path = f"{self._dir}/{CHECKPOINT_FILE}"
        self._mutex = threading.Lock()
        self._files: list[IndexFile] = []
        self._file_lock: FileLock | None = None
        self._store_id = NO_STORE_ID
        self._applied = 0  # end of the last entry applied (in memory)
        self._confirmed = 0  # what the checkpoint on disk says
        self._min_offset = 0
        self._ckpt_stale = False
        self._next_flush_ms = 0.0
        self._last_name_ms = 0
        self._failure: BaseException | None = None
        self._open = False
        self._sharded = config.shard_count > 1
        self.recovery: RecoveryReport | None = None
        # The log's history as of the last handshake: the epochs of what the files hold
        # ({index_dir}/epochs, written after the handshake's truncation is durable).
        self._epochs = EpochStore(self.disk, self._dir)
        self.history = LogHistory()

    # -- life cycle -----------------------------------------------------------------------------

    def open(self) -> RecoveryReport:
        """Lock the directory, recover, checkpoint. The report says from which commit-log offset
        to replay (it is also `confirmed_offset`)."""
        check(not self._open, "index engine opened twice")
        self.disk.makedirs(self._dir)
        self._file_lock = self.disk.lock(f"{self._dir}/{LOCK_FILE}")
        try:
            ckpt, note = self._load_checkpoint()
            result = recover(self.disk, self.config, ckpt, ckpt_note=note)
            report = result.report
            self._files = result.files
            if ckpt is not None:
                self._store_id = ckpt.store_id
                self._min_offset = ckpt.min_offset
            self._applied = report.replay_from_offset
            self.history = self._epochs.load_follower(self._store_id)
            if self._files:
                active = self._files[-1]
                if not active.sealed:
                    active.rec.flags &= ~FILE_HEAD_CRC  # it will be written again
                self._last_name_ms = active.rec.name_ms
            self._write_checkpoint(clean=False)
        except BaseException:
            for f in self._files:
                f.close()
            self._files = []
            self._file_lock.release()
            self._file_lock = None
            raise
        self._open = True
        self._next_flush_ms = self.clock.monotonic_ms() + self.config.flush_interval_ms
        self.recovery = report
        log.info(
            "index open: %s exit, %d files kept, %d deleted, %d damaged, %d entries cut, "
            "replay from %d (%.1f ms)",
            "clean" if report.clean_exit else "unclean",
            report.files_kept,
            len(report.files_deleted),
            len(report.damaged),
            report.entries_cut,
            report.replay_from_offset,
            report.duration_ms,
        )
        return report

    def close(self) -> None:
        """Flush and checkpoint as a clean close; after a failure, leave the checkpoint as it
        is so that the next open recovers."""
        with self._mutex:
            if not self._open:
                return
            self._open = False
            try:
                if self._failure is None:
                    for f in self._files:
                        if not f.sealed:
                            f.seal(full=False)
                    self._write_checkpoint(clean=True)
            except Exception:
                log.exception("index close could not flush; the next open recovers")
            finally:
                for f in self._files:
                    f.close()
                self._files = []
                if self._file_lock is not None:
                    self._file_lock.release()
                    self._file_lock = None

    def _load_checkpoint(self) -> tuple[IndexCheckpoint | None, str]:
        if not self.disk.exists(self._ckpt_path):
            return None, ""
        try:
            return decode_checkpoint(self.disk.read(self._ckpt_path), path=self._ckpt_path), ""
        except CorruptFile as exc:
            log.error("ignoring a corrupt index checkpoint: %s", exc)
            return None, f"corrupt checkpoint: {exc.reason}"

    # -- state ----------------------------------------------------------------------------------

    @property
    def store_id(self) -> bytes:
        return self._store_id

    @property
    def applied_offset(self) -> int:
        return self._applied

    @property
    def confirmed_offset(self) -> int:
        """Every entry below it is applied and flushed: the subscriber's confirmed offset."""
        return self._confirmed

    @property
    def min_offset(self) -> int:
        return self._min_offset

    @property
    def file_names(self) -> list[str]:
        with self._mutex:
            return [f.name for f in self._files]

    @property
    def entry_count(self) -> int:
        with self._mutex:
            return sum(f.header.entries for f in self._files)

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped writes (a failed flush or checkpoint), or None."""
        return self._failure

    def owns(self, topic: str, key: str) -> bool:
        """Whether this engine's shard indexes `key` of `topic`."""
        if not self._sharded:
            return True
        h64 = key_hash64(index_key(topic, key))
        return shard_of_hash(h64, self.config.shard_count) == self.config.shard_index

    def _check_writable(self) -> None:
        if not self._open:
            raise Unavailable("index engine is not open")
        if self._failure is not None:
            raise Unavailable(f"index writes stopped after a failure: {self._failure}")

    # -- apply ----------------------------------------------------------------------------------

    def apply(self, entries: Sequence[DispatchEntry]) -> int:
        """Index one dispatch batch (entries in commit-log order): apply_columns of its columns
        (entry lists come from tests and tools; the service applies frames as columns)."""
        columns = (
            entries
            if isinstance(entries, DispatchColumns)
            else DispatchColumns.from_entries(entries)
        )
        return self.apply_columns(columns)

    def _applied_to(self, applied: int) -> None:
        """Under the mutex, after a batch: the new applied offset, and a flush when due."""
        if applied != self._applied:
            self._applied = applied
            self._ckpt_stale = True
        failpoints.hit("index.after_apply")
        if self.clock.monotonic_ms() >= self._next_flush_ms:
            self._flush_locked()

    def apply_columns(self, columns: DispatchColumns) -> int:
        """Index one dispatch frame (rows in commit-log order). Rows starting below the applied
        offset were applied before and are skipped. Returns the keys indexed.

        Two compiled passes over the columns: which rows are written (_core.index_rows: the
        walk over entries, replays skipped, rolled-back transactions not written), then the
        index hash of each of their keys straight from the frame's UTF-8 string columns
        (keyhash.message_key_hashes: message_keys' keys and order), no str per key."""
        with self._mutex:
            self._check_writable()
            taken, applied = _core.index_rows(
                columns.commit_log_offsets, columns.sizes, columns.sys_flags, self._applied
            )
            rows = np.frombuffer(taken, dtype=np.int64)
            written = self._put_columns(columns, rows) if len(rows) else 0
            self._applied_to(applied)
            return written

    def _put_columns(self, columns: DispatchColumns, rows: Column) -> int:
        uniq, tokens = columns.uniq_keys, columns.keys
        if not uniq and not tokens:
            return 0
        hashes, at = keyhash.message_key_hashes(
            columns.topics,
            columns.topic_indexes,
            rows,
            (uniq.data, uniq.offsets),
            (tokens.data, tokens.offsets),
        )
        if not len(at):
            return 0

        def key_strings() -> list[str]:
            """The keys as str, for the 64-bit hashes (exact or sharded mode only)."""
            topics, topic_indexes = columns.topics, columns.topic_indexes
            out: list[str] = []
            for i in rows.tolist():
                out.extend(
                    message_keys(
                        topics[int(topic_indexes[i])],
                        uniq[i] if uniq else "",
                        tokens[i] if tokens else "",
                    )
                )
            return out

        return self._put_hashed(
            hashes,
            columns.commit_log_offsets[at],
            columns.store_timestamps_ms[at],
            key_strings,
        )

    def _put_hashed(
        self,
        hashes: np.ndarray,
        phys: np.ndarray,
        times: np.ndarray,
        keys: Callable[[], Sequence[str]],
    ) -> int:
        """_put of keys already hashed; `keys()` gives the key strings when the 64-bit hashes
        are needed (exact or sharded mode)."""
        h64: np.ndarray | None = None
        if self.config.exact or self._sharded:
            h64 = keyhash.hashes64(keys())
            if self._sharded:
                mine = keyhash.jump_shards(h64, self.config.shard_count)
                keep = mine == self.config.shard_index
                hashes, phys, times, h64 = hashes[keep], phys[keep], times[keep], h64[keep]
            if not self.config.exact:
                h64 = None
        m = len(hashes)
        if m == 0:
            return 0
        active = self._files[-1] if self._files else None
        room = active.capacity_left if active is not None else 0
        per_file = self.config.entry_num - 1
        new_files: list[IndexFile] = []
        try:
            for first in range(room, m, per_file):
                new_files.append(self._create_file(int(phys[first])))
        except BaseException:
            for f in new_files:
                f.destroy()
            self.disk.fsync_dir(self._dir)
            raise
        targets = ([active] if active is not None and room > 0 else []) + new_files
        done = 0
        rolled = False
        for f in targets:
            if f is not active:
                if self._files:
                    self._files[-1].rec.end_offset = f.rec.start_offset
                    self._seal(self._files[-1])
                self._files.append(f)
                rolled = True
            n = min(f.capacity_left, m - done)
            f.put(
                hashes[done : done + n],
                phys[done : done + n],
                times[done : done + n],
                None if h64 is None else h64[done : done + n],
            )
            done += n
        check(done == m, f"batch of {m} keys wrote {done}")
        self._ckpt_stale = True
        if rolled:
            # RocketMQ flushes a file when it fills; here the checkpoint follows at once, so
            # recovery never has to look behind the newest file.
            self._next_flush_ms = 0.0
        return m

    def _create_file(self, first_phy: int) -> IndexFile:
        name_ms = max(self.clock.now_ms(), self._last_name_ms + 1)
        f = IndexFile.create(
            self.disk,
            self._dir,
            name_ms=name_ms,
            slot_num=self.config.slot_num,
            entry_num=self.config.entry_num,
            start_offset=first_phy,
            exact=self.config.exact,
        )
        self._last_name_ms = name_ms
        failpoints.hit("index.after_create")
        return f

    def _seal(self, f: IndexFile) -> None:
        if f.sealed:
            return
        try:
            f.seal(full=True)
        except Exception as exc:
            self._fail(exc)
            raise FlushFailed(f"sealing index file {f.name} failed: {exc}") from exc
        failpoints.hit("index.after_seal")

    # -- flush and checkpoint -------------------------------------------------------------------

    def flush(self) -> int:
        """Flush everything applied and checkpoint; returns the confirmed offset."""
        with self._mutex:
            self._check_writable()
            self._flush_locked()
            return self._confirmed

    def flush_if_due(self) -> bool:
        """For an idle timer: flush if the interval has passed and something is unflushed."""
        with self._mutex:
            if not self._open or self._failure is not None:
                return False
            if self.clock.monotonic_ms() < self._next_flush_ms or not self._ckpt_stale:
                return False
            self._flush_locked()
            return True

    def _flush_locked(self) -> None:
        self._next_flush_ms = self.clock.monotonic_ms() + self.config.flush_interval_ms
        if not self._ckpt_stale:
            return
        try:
            for f in self._files:
                if not f.sealed:
                    f.flush()
        except Exception as exc:
            self._fail(exc)
            raise FlushFailed(f"index flush failed: {exc}") from exc
        self._write_checkpoint(clean=False)

    def _write_checkpoint(self, *, clean: bool) -> None:
        if self._files and not self._files[-1].sealed:
            self._files[-1].rec.end_offset = self._applied
        ckpt = IndexCheckpoint(
            store_id=self._store_id,
            confirmed_offset=self._applied,
            min_offset=self._min_offset,
            written_at_ms=self.clock.now_ms(),
            shard_count=self.config.shard_count,
            shard_index=self.config.shard_index,
            exact=self.config.exact,
            clean_close=clean,
            files=[f.rec for f in self._files],
        )
        failpoints.hit("index.before_checkpoint")
        try:
            write_atomic(self.disk, self._ckpt_path, encode_checkpoint(ckpt))
        except Exception as exc:
            self._fail(exc)
            raise FlushFailed(f"index checkpoint write failed: {exc}") from exc
        failpoints.hit("index.after_checkpoint")
        self._confirmed = self._applied
        self._ckpt_stale = False

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            log.error("index writes stop: %s", exc)
            self._failure = exc

    # -- queries --------------------------------------------------------------------------------

    def _key_hashes(self, topic: str, key: str) -> tuple[int, int | None]:
        """(32-bit index hash, 64-bit hash in exact mode) of a queried key; FailedPrecondition
        (naming the right shard) when the key belongs to another shard: the client routed it
        to the wrong replica, and the same query succeeds at the right one."""
        indexed = index_key(topic, key)
        h64: int | None = None
        if self.config.exact or self._sharded:
            h64 = key_hash64(indexed)
            if self._sharded:
                shard = shard_of_hash(h64, self.config.shard_count)
                if shard != self.config.shard_index:
                    raise FailedPrecondition(
                        f"key belongs to shard {shard} of {self.config.shard_count}, "
                        f"this is shard {self.config.shard_index}"
                    )
            if not self.config.exact:
                h64 = None
        return index_key_hash(indexed), h64

    def query(self, topic: str, key: str, begin_ms: int, end_ms: int, max_count: int) -> list[int]:
        """Candidate commit-log offsets for `key` of `topic` that may have been stored within
        [begin_ms, end_ms], newest first, distinct, at most min(max_count, max_candidates),
        none below the minimum offset. An entry's time is kept in whole seconds, so the walk
        takes every entry whose second overlaps the range (up to 999 ms before begin_ms).
        Candidates may include other keys with an equal hash (fewer in exact mode) and times
        just outside the range: `lookup` confirms both against the records."""
        if not key:
            raise InvalidArgument("empty key", field="key")
        limit = min(max_count, self.config.max_candidates)
        if limit <= 0 or begin_ms > end_ms:
            return []
        # An entry read as second s was stored in [s, s + 999 ms]: it may lie in the range
        # when s + 999 >= begin_ms.
        walk_begin_ms = max(0, begin_ms - (ENTRY_TIME_UNIT_MS - 1))
        key_hash, h64 = self._key_hashes(topic, key)
        out: list[int] = []
        seen: set[int] = set()
        floor = self._min_offset
        with self._mutex:
            if not self._open:
                raise Unavailable("index engine is not open")
            for f in reversed(self._files):
                header = f.header
                if fmt.is_time_matched(header, walk_begin_ms, end_ms):
                    for phy in f.select(key_hash, h64, walk_begin_ms, end_ms):
                        if phy < floor or phy in seen:
                            continue
                        seen.add(phy)
                        out.append(phy)
                        if len(out) >= limit:
                            return out
                if header.begin_ts_ms < begin_ms:
                    break
        return out

    def query_uniq(self, topic: str, uniq_key: str, max_count: int | None = None) -> list[int]:
        """Candidates for a unique id over all time (the broker's queryMessageByUniqKey)."""
        limit = self.config.uniq_max_results if max_count is None else max_count
        return self.query(topic, uniq_key, 0, TIME_MAX_MS, limit)

    def lookup(
        self,
        topic: str,
        key: str,
        begin_ms: int,
        end_ms: int,
        max_count: int,
        fetch: Fetch,
    ) -> list[int]:
        """Offsets of messages whose topic and key really match and whose store time lies in
        [begin_ms, end_ms] to the millisecond, newest first, at most min(max_count,
        max_results). `fetch` reads the records of a list of offsets in one batched call
        (offsets it cannot read are left out of its answer). When confirmation drops
        candidates, the walk is widened (x4, up to max_candidates) and only the new candidates
        are fetched."""
        want = min(max_count, self.config.max_results)
        return self._lookup(
            lambda n: self.query(topic, key, begin_ms, end_ms, n),
            lambda cands, recs: within(
                confirm_key(cands, recs, topic, key), recs, begin_ms, end_ms
            ),
            want,
            fetch,
        )

    def lookup_uniq(self, topic: str, uniq_key: str, fetch: Fetch) -> list[int]:
        """Offsets of the messages whose unique id is `uniq_key` in `topic`."""
        return self._lookup(
            lambda n: self.query_uniq(topic, uniq_key, n),
            lambda cands, recs: confirm_uniq(cands, recs, topic, uniq_key),
            self.config.uniq_max_results,
            fetch,
        )

    def _lookup(
        self,
        candidates_of: Callable[[int], list[int]],
        confirm: Callable[[Sequence[int], Mapping[int, KeyedRecord]], list[int]],
        want: int,
        fetch: Fetch,
    ) -> list[int]:
        if want <= 0:
            return []
        records: dict[int, KeyedRecord] = {}
        asked: set[int] = set()
        window = want
        while True:
            candidates = candidates_of(window)
            new = [c for c in candidates if c not in asked]
            if new:
                asked.update(new)
                records.update(fetch(new))
            confirmed = confirm(candidates, records)
            if (
                len(confirmed) >= want
                or len(candidates) < window
                or window >= self.config.max_candidates
            ):
                return confirmed[:want]
            window = min(self.config.max_candidates, window * 4)

    # -- maintenance ----------------------------------------------------------------------------

    def delete_expired(self, min_commit_log_offset: int) -> list[str]:
        """Forget what lies below the commit log's minimum offset: candidates below it are no
        longer returned, and the leading files whose last entry is below it are deleted (never
        the newest file, as RocketMQ). Returns the names deleted."""
        with self._mutex:
            self._check_writable()
            return self._delete_expired_locked(min_commit_log_offset)

    def _delete_expired_locked(self, min_offset: int) -> list[str]:
        if min_offset > self._min_offset:
            self._min_offset = min_offset
            self._ckpt_stale = True
        doomed: list[IndexFile] = []
        while len(self._files) > 1 and self._files[0].header.end_phy < min_offset:
            doomed.append(self._files.pop(0))
        if doomed or self._ckpt_stale:
            # The checkpoint stops naming them before they go: a crash in between leaves files
            # no checkpoint names, which the next open deletes.
            self._ckpt_stale = True
            self._flush_locked()
        for f in doomed:
            f.destroy()
        if doomed:
            self.disk.fsync_dir(self._dir)
            log.info("deleted %d expired index files below %d", len(doomed), min_offset)
        return [f.name for f in doomed]

    def truncate(self, offset: int) -> int:
        """Drop every entry pointing at or beyond `offset` (the commit log lost that tail):
        newer files whole, the newest kept one from its first such entry (see recovery.py).
        The applied and confirmed offsets come down to `offset`. Returns the entries dropped."""
        with self._mutex:
            self._check_writable()
            return self._truncate_locked(offset)

    def _truncate_locked(self, offset: int) -> int:
        if offset >= self._applied:
            return 0
        self._files, dropped = cut_at_offset(self._files, offset)
        self.disk.fsync_dir(self._dir)
        self._applied = offset
        self._ckpt_stale = True
        self._flush_locked()
        log.warning("index truncated at %d: %d entries dropped", offset, dropped)
        return dropped

    def reset(self, store_id: bytes) -> None:
        """Drop every file and follow another commit log from its start."""
        check(len(store_id) == STORE_ID_BYTES, "store ids are 16 bytes")
        with self._mutex:
            self._check_writable()
            self._reset_locked(store_id)

    def _reset_locked(self, store_id: bytes) -> None:
        dropped = self._files
        self._files = []
        self._store_id = store_id
        self._applied = 0
        self._min_offset = 0
        self._ckpt_stale = True
        self._flush_locked()
        for f in dropped:
            f.destroy()
        self.disk.fsync_dir(self._dir)

    def handshake(
        self,
        store_id: bytes,
        min_offset: int,
        truncate_offset: int,
        history: LogHistory | None = None,
    ) -> int:
        """Agree with the commit log's handshake frame (DESIGN.md, start-up handshake) before
        applying anything; returns the offset dispatch will flow from.

            another store id                  drop everything, follow the new log from its
                                              start
            applied offset > truncate_offset  our history and the log's part there (a
                                              recovery cut the log): truncate at it
            min_offset above ours             segments expired: raise the minimum, delete
                                              files

        The log's history (when given) then becomes ours, once the truncation is durable.
        """
        check(len(store_id) == STORE_ID_BYTES, "store ids are 16 bytes")
        with self._mutex:
            self._check_writable()
            if store_id != self._store_id:
                if self._store_id != NO_STORE_ID or self._files or self._applied:
                    log.warning("the commit log's store id changed: rebuilding the index")
                    self._reset_locked(store_id)
                else:
                    self._store_id = store_id
                    self._ckpt_stale = True
            if self._applied > truncate_offset:
                self._truncate_locked(truncate_offset)
            self._delete_expired_locked(min_offset)
            if self._applied < min_offset:
                self._applied = min_offset  # nothing below it will ever be sent
                self._ckpt_stale = True
            self._flush_locked()
            if history is not None and history != self.history:
                self._epochs.save(store_id, history)
                self.history = history
            return self._applied
