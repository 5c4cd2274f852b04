"""The commit log: appends, flush policies, recovery, reads and the dispatch scan.

A library; commitlog_svc's servicer wraps it. Life cycle:

    log = CommitLog(config)          # nothing touched yet
    report = log.open()              # lock, load, recover, checkpoint, abort marker, threads
    log.append_batch([...])          # from any thread
    log.close()                      # flush, checkpoint, remove the abort marker, unlock

Appends take one lock (RocketMQ's putMessageLock). Everything that can be computed without it
(limits, CRC, the record's tail) is computed before it; under it the store assigns queue
offsets, the store timestamp and physical offsets, writes the batch in place and publishes it
with one position update, so a reader sees a batch whole or not at all.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from commitlog_svc.config import CommitLogConfig, FlushMode
from commitlog_svc.flush import FlushService
from commitlog_svc.messages import AppendResult, MessageIn, PutStatus
from commitlog_svc.recovery import CorruptRange, RecoveryReport, recover
from commitlog_svc.retention import RetentionPolicy, RetentionReport
from commitlog_svc.store_files import StoreFiles
from mqstore.errors import (
    CorruptRecord,
    DataLoss,
    DiskFull,
    InvalidArgument,
    OutOfRange,
    PropertiesTooLarge,
    Unavailable,
    check,
)
from mqstore.formats.commitlog_checkpoint import Checkpoint, QueueKey
from mqstore.formats.record import (
    END_FILE_MIN_BLANK_BYTES,
    Bad,
    Blank,
    Record,
    encode_blank,
    find_next_record,
    read_record,
)
from mqstore.formats.record_batch import (
    BatchEncoder,
    EncodedBatch,
    MessageBatch,
    QueueTable,
    batches_from_messages,
    table_to_pairs,
    undo_queue_offsets,
)
from mqstore.storage.clock import Clock, SystemClock
from mqstore.storage.disk import Disk, FileLock, OsDisk
from mqstore.storage.mapped_file import MappedFile
from mqstore.storage.mapped_file_queue import MappedFileQueue
from mqstore.storage.transient_pool import TransientStorePool
from mqstore.storage.warmer import SegmentWarmer

log = logging.getLogger(__name__)

# After a failed file creation (disk full), appends are refused outright for this long before
# one is let through to try again: a full disk should not cost a failed fallocate per call.
DISK_FULL_RETRY_MS = 1_000


@dataclass(slots=True)
class ScanBatch:
    """Records read in order from `start_offset`; continue at `next_offset`."""

    start_offset: int
    next_offset: int
    records: list[Record] = field(default_factory=list)
    corrupt: list[CorruptRange] = field(default_factory=list)


def _as_batches(
    messages: MessageBatch | Sequence[MessageBatch | MessageIn],
) -> Sequence[MessageBatch]:
    if isinstance(messages, MessageBatch):
        return (messages,)
    if all(isinstance(m, MessageBatch) for m in messages):
        return messages  # type: ignore[return-value]
    if any(isinstance(m, MessageBatch) for m in messages):
        raise InvalidArgument("mix of MessageBatch and MessageIn in one append")
    return batches_from_messages(messages)  # type: ignore[arg-type]


class CommitLog:
    def __init__(
        self,
        config: CommitLogConfig,
        *,
        disk: Disk | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.disk: Disk = disk if disk is not None else OsDisk()
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._files = StoreFiles(self.disk, config.data_dir)
        pool = None
        if config.transient_pool:
            pool = TransientStorePool(config.transient_pool_buffers, config.file_bytes)
        self.queue = MappedFileQueue(self.disk, config.commitlog_dir, config.file_bytes, pool=pool)
        self._store_host = config.store_host
        self._limits = config.limits
        self._put_lock = threading.Lock()
        self._put_lock_timeout_s = config.put_lock_timeout_ms / 1000.0
        self._encoder = BatchEncoder(self._store_host, self._limits)
        self._queue_offsets: QueueTable = {}
        self._lock: FileLock | None = None
        self._flusher: FlushService | None = None
        self._warmer: SegmentWarmer | None = None
        self._retention = RetentionPolicy(config, self.disk, self.clock)
        self._retention_thread: threading.Thread | None = None
        self._retention_stop = threading.Event()
        self._floor_offset: Callable[[], int] | None = None
        self.store_id = b""
        self.recovery: RecoveryReport | None = None
        self._running = False
        self._flush_failed: BaseException | None = None
        self._disk_full_until_ms = 0.0  # refuse appends until then (monotonic ms)
        self._disk_full_by_ratio = False
        self._last_checkpoint_offset = -1
        self._corrupt_starts: dict[int, str] = {}

    # -- life cycle -----------------------------------------------------------------------------

    def open(self, *, retention: bool = False) -> RecoveryReport:
        """Take the lock, load and recover the files, and start the flush thread."""
        check(not self._running, "commit log opened twice")
        self.disk.makedirs(self.config.data_dir)
        self._lock = self.disk.lock(self._files.lock_path())
        try:
            clean_exit = not self._files.abort_exists()
            self.queue.load()
            meta = self._files.load_or_create_meta(
                has_data=bool(self.queue.files),
                now_ms=self.clock.now_ms(),
                file_bytes=self.config.file_bytes,
            )
            self.store_id = meta.store_id
            ckpt = self._files.load_checkpoint()
            if ckpt is not None and ckpt.store_id != meta.store_id:
                log.error("checkpoint belongs to another store id; ignoring it")
                ckpt = None
            result = recover(self.queue, ckpt, clean_exit=clean_exit)
            self.recovery = result.report
            self._queue_offsets = result.queue_offsets
            # Recovery found these damaged records: a read of one is DATA_LOSS even when the
            # damage hit its magic code (which alone would look like "no record here").
            self._corrupt_starts = {c.start_offset: c.reason for c in result.report.corrupt}
            end = result.report.end_offset
            # What recovery kept may still sit only in the page cache (a kill -9 keeps it
            # there): make it durable before a checkpoint vouches for it.
            for mf in self.queue.files:
                if mf.file_end_offset > result.report.start_offset:
                    mf.flushed_position = 0
            self.queue.flushed_where = result.report.start_offset
            self.queue.committed_where = end
            self.queue.flush(0)
            self.queue.flushed_where = end
            self._write_checkpoint(end, table_to_pairs(self._queue_offsets))
            self._files.create_abort()
        except BaseException:
            self.queue.shutdown()
            self._lock.release()
            self._lock = None
            raise
        self._flusher = FlushService(
            self.queue,
            self.config,
            self.clock,
            checkpoint=self._checkpoint,
            on_failure=self._on_flush_failure,
        )
        self._flusher.start()
        self._warmer = SegmentWarmer(self.queue, self.config.warm_ahead_bytes)
        self._warmer.start()
        self._running = True
        if retention:
            self._start_retention()
        report = result.report
        log.info(
            "commit log open: %s exit, offsets [%d, %d), scanned %d records from %d in %.1f ms, "
            "truncated %d bytes, %d corrupt ranges",
            "clean" if report.clean_exit else "unclean",
            self.min_offset,
            end,
            report.records_scanned,
            report.start_offset,
            report.duration_ms,
            report.truncated_bytes,
            len(report.corrupt),
        )
        return report

    def close(self) -> None:
        """Flush, checkpoint and remove the abort marker; the marker stays if anything failed,
        so the next start checks the tail again."""
        if not self._running:
            return
        self._running = False
        self._stop_retention()
        if self._warmer is not None:
            self._warmer.stop()
        flusher = self._flusher
        assert flusher is not None
        # Stop the flush thread before taking the put lock: a checkpoint round in progress
        # takes that lock itself, and joining it while holding the lock would deadlock.
        flusher.stop()
        with self._put_lock:
            clean = self._flush_failed is None and flusher.failure is None
            if clean:
                try:
                    flusher.flush_now()
                    end = self.queue.max_wrote_offset()
                    self._write_checkpoint(end, table_to_pairs(self._queue_offsets))
                    self._files.remove_abort()
                except Exception:
                    log.exception("shutdown flush failed; the next start recovers the tail")
            flusher.wake()
            self.queue.shutdown()
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def __enter__(self) -> CommitLog:
        if not self._running:
            self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._running

    # -- state ----------------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        return self.queue.min_offset()

    @property
    def max_offset(self) -> int:
        """End of readable data (committed data with the transient pool)."""
        return self.queue.max_offset()

    @property
    def flushed_offset(self) -> int:
        return self.queue.flushed_where

    @property
    def confirm_offset(self) -> int:
        """How far dispatch may go: the flushed end under sync flush (nothing is visible before
        it is durable), the readable end under async (RocketMQ's getConfirmOffset)."""
        if self.config.flush is FlushMode.SYNC:
            return self.queue.flushed_where
        return self.queue.max_offset()

    @property
    def warmed_bytes(self) -> int:
        """Bytes of segments faulted in ahead of the writes so far (see storage/warmer.py)."""
        return self._warmer.warmed_bytes if self._warmer is not None else 0

    @property
    def writable(self) -> bool:
        return self._refusal() is None

    @property
    def disk_full(self) -> bool:
        return self._disk_full_by_ratio or self._disk_full_until_ms > 0

    @property
    def store_host(self) -> bytes:
        return self._store_host

    def queue_offset(self, topic: str, queue_id: int) -> int:
        """The next queue offset the store will assign in (topic, queue_id)."""
        return self._queue_offsets.get(topic, {}).get(queue_id, 0)

    def queue_offsets(self) -> dict[QueueKey, int]:
        with self._put_lock:
            return table_to_pairs(self._queue_offsets)

    def _refusal(self) -> str | None:
        if not self._running:
            return "the store is not open"
        if self._flush_failed is not None:
            return f"a flush failed ({self._flush_failed!r}); writes stop until restart"
        if self._disk_full_by_ratio:
            return "disk usage is over the warning ratio"
        if self._disk_full_until_ms and self.clock.monotonic_ms() < self._disk_full_until_ms:
            return "the disk is full"
        return None

    def _on_flush_failure(self, exc: BaseException) -> None:
        self._flush_failed = exc

    # -- appends --------------------------------------------------------------------------------

    def append(self, message: MessageIn) -> AppendResult:
        return self.append_batch((message,))

    def append_batch(
        self, messages: MessageBatch | Sequence[MessageBatch | MessageIn]
    ) -> AppendResult:
        """Store messages in order; one status per message. Refused messages change nothing;
        the others are written together in one segment and published together.

        The fast form is a columnar `MessageBatch` (or several); a sequence of `MessageIn`
        objects is grouped into batches first."""
        batches = _as_batches(messages)
        count = sum(len(b) for b in batches)
        if count == 0:
            return AppendResult(statuses=[])
        if count > self._limits.batch_messages_max:
            return AppendResult.refused(
                count,
                PutStatus.MESSAGE_ILLEGAL,
                f"batch of {count} messages, over the {self._limits.batch_messages_max} limit",
            )
        refusal = self._refusal()
        if refusal is not None:
            return AppendResult.refused(count, PutStatus.SERVICE_NOT_AVAILABLE, refusal)
        if not self._put_lock.acquire(timeout=self._put_lock_timeout_s):
            return AppendResult.refused(
                count, PutStatus.OS_PAGE_CACHE_BUSY, "the write lock was busy past the bound"
            )
        try:
            result, end = self._append_locked(batches, count)
        finally:
            self._put_lock.release()
        if end >= 0 and self.config.flush is FlushMode.SYNC:
            assert self._flusher is not None
            status = self._flusher.wait_durable(end, self.config.sync_flush_timeout_ms)
            if status is not PutStatus.PUT_OK:
                for i, s in enumerate(result.statuses):
                    if s is PutStatus.PUT_OK:
                        result.statuses[i] = status
                        result.reasons[i] = "not durable: " + status.name
        return result

    def _append_locked(
        self, batches: Sequence[MessageBatch], count: int
    ) -> tuple[AppendResult, int]:
        """Under the put lock: encode (assigning queue offsets), place, write, publish.
        Returns the result and the end offset of what was written (-1 if nothing)."""
        refusal = self._refusal()
        if refusal is not None:
            return AppendResult.refused(count, PutStatus.SERVICE_NOT_AVAILABLE, refusal), -1
        try:
            mf = self.queue.get_last_mapped_file(0)
        except DiskFull as exc:
            return self._disk_full(count, exc), -1
        assert mf is not None
        store_ts = self.clock.now_ms()
        encoded = self._encoder.encode(
            batches,
            base_offset=mf.file_from_offset + mf.wrote_position,
            store_timestamp_ms=store_ts,
            queue_table=self._queue_offsets,
        )
        nbytes = encoded.nbytes
        if nbytes == 0:
            return self._result(encoded, store_ts), -1
        if nbytes + END_FILE_MIN_BLANK_BYTES > mf.remaining():
            if nbytes + END_FILE_MIN_BLANK_BYTES > self.config.file_bytes:
                # A batch never spans files, so one that cannot fit an empty file is refused.
                undo_queue_offsets(batches, encoded, self._queue_offsets)
                reason = (
                    f"batch of {nbytes} bytes does not fit a {self.config.file_bytes}-byte segment"
                )
                result = self._result(encoded, store_ts)
                for i in encoded.accepted():
                    result.statuses[i] = PutStatus.MESSAGE_ILLEGAL
                    result.reasons[i] = reason
                    result.offsets[i] = result.queue_offsets[i] = -1
                    result.sizes[i] = 0
                return result, -1
            try:
                mf = self._roll(mf)
            except DiskFull as exc:
                undo_queue_offsets(batches, encoded, self._queue_offsets)
                return self._disk_full(count, exc), -1
            encoded.relocate(mf.file_from_offset)
        self._disk_full_until_ms = 0.0
        pos = mf.wrote_position
        mf.write_buf[pos : pos + nbytes] = encoded.blob
        mf.store_timestamp_ms = store_ts
        mf.advance(nbytes)
        return self._result(encoded, store_ts), encoded.base_offset + nbytes

    @staticmethod
    def _result(encoded: EncodedBatch, store_ts: int) -> AppendResult:
        base = encoded.base_offset
        offsets = [base + p for p in encoded.positions]
        if not encoded.refused:
            return AppendResult(
                statuses=[PutStatus.PUT_OK] * encoded.count,
                offsets=offsets,
                sizes=encoded.sizes,
                queue_offsets=encoded.queue_offsets,
                store_timestamp_ms=store_ts,
                reasons=[""] * encoded.count,
            )
        result = AppendResult.refused(encoded.count, PutStatus.PUT_OK, "")
        result.store_timestamp_ms = store_ts
        for i, error in encoded.refused:
            result.statuses[i] = (
                PutStatus.PROPERTIES_SIZE_EXCEEDED
                if isinstance(error, PropertiesTooLarge)
                else PutStatus.MESSAGE_ILLEGAL
            )
            result.reasons[i] = str(error)
        for j, i in enumerate(encoded.accepted()):
            result.offsets[i] = offsets[j]
            result.sizes[i] = encoded.sizes[j]
            result.queue_offsets[i] = encoded.queue_offsets[j]
        return result

    def _roll(self, mf: MappedFile) -> MappedFile:
        """Close `mf` with the end-of-file blank and return the next file. The next file is
        created first: a failed creation (DiskFull) leaves everything as it was."""
        nxt = self.queue.create_file(mf.file_end_offset)
        remaining = mf.remaining()
        if remaining > 0:
            pos = mf.wrote_position
            mf.write_buf[pos : pos + END_FILE_MIN_BLANK_BYTES] = encode_blank(remaining)
            mf.advance(remaining)
        return nxt

    def _disk_full(self, count: int, exc: DiskFull) -> AppendResult:
        log.error("cannot create a commit-log segment: %s", exc)
        self._disk_full_until_ms = self.clock.monotonic_ms() + DISK_FULL_RETRY_MS
        return AppendResult.refused(count, PutStatus.CREATE_MAPPED_FILE_FAILED, str(exc))

    # -- reads ----------------------------------------------------------------------------------

    def _file_at(self, offset: int) -> MappedFile:
        if offset < self.min_offset:
            raise OutOfRange(f"offset {offset} is below the log's minimum {self.min_offset}")
        if offset >= self.max_offset:
            raise OutOfRange(f"offset {offset} is at or beyond the log's end {self.max_offset}")
        mf = self.queue.find_mapped_file_by_offset(offset)
        if mf is None:
            raise OutOfRange(f"no segment holds offset {offset}")
        return mf

    def read(self, offset: int, size: int) -> bytes:
        """Raw bytes [offset, offset+size), which must lie in one segment and be readable."""
        if size <= 0:
            raise InvalidArgument(f"size must be positive, got {size}", field="size")
        mf = self._file_at(offset)
        pos = offset - mf.file_from_offset
        if pos + size > mf.read_position:
            raise OutOfRange(f"range [{offset}, {offset + size}) runs past readable data")
        return mf.read(pos, size)

    def read_record(self, offset: int) -> Record:
        """The record starting at `offset`, CRC-checked. InvalidArgument if no record starts
        there, CorruptRecord (DATA_LOSS) if the one there fails its checks."""
        mf = self._file_at(offset)
        if not mf.hold():
            raise DataLoss(f"the segment holding {offset} was deleted")
        try:
            pos = offset - mf.file_from_offset
            found = read_record(
                mf.read_buf, pos, mf.read_position, check_crc=True, expected_offset=offset
            )
        finally:
            mf.release()
        if isinstance(found, Record):
            return found
        known = self._corrupt_starts.get(offset)
        if known is not None:
            raise CorruptRecord(offset, known)
        if isinstance(found, Blank) or found.no_record:
            raise InvalidArgument(f"no record starts at offset {offset}", field="offset")
        raise CorruptRecord(offset, found.reason)

    def read_records(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Raw bytes of whole records, each (offset, size) checked to be one intact record."""
        out = []
        for offset, size in ranges:
            raw = self.read(offset, size)
            found = read_record(raw, 0, size, check_crc=True, expected_offset=offset)
            if not isinstance(found, Record) or found.total_size != size:
                reason = found.reason if isinstance(found, Bad) else "not one whole record"
                raise CorruptRecord(offset, reason)
            out.append(raw)
        return out

    def scan(
        self,
        from_offset: int,
        *,
        max_records: int = 1024,
        max_bytes: int = 4 << 20,
        end_offset: int | None = None,
        check_crc: bool = False,
    ) -> ScanBatch:
        """Records from `from_offset` (a record boundary) up to `end_offset` (default: the
        confirm offset), at most `max_records` / about `max_bytes`. The dispatch source.

        Blanks move on to the next file. A bad record is skipped to the next valid one and
        reported in `corrupt`, so one damaged record never stalls the stream.
        """
        end = self.confirm_offset if end_offset is None else min(end_offset, self.max_offset)
        if from_offset < self.min_offset:
            raise OutOfRange(f"offset {from_offset} is below the log's minimum {self.min_offset}")
        batch = ScanBatch(from_offset, from_offset)
        offset = from_offset
        taken = 0
        while offset < end and len(batch.records) < max_records and taken < max_bytes:
            mf = self.queue.find_mapped_file_by_offset(offset)
            if mf is None or not mf.hold():
                break
            try:
                reached, taken = self._scan_file(
                    mf, offset, end, batch, max_records, max_bytes, taken, check_crc
                )
            finally:
                mf.release()
            if reached == offset:
                break  # the next record ends beyond `end`: it belongs to a later call
            offset = reached
        batch.next_offset = offset
        return batch

    def _scan_file(
        self,
        mf: MappedFile,
        offset: int,
        end: int,
        batch: ScanBatch,
        max_records: int,
        max_bytes: int,
        taken: int,
        check_crc: bool,
    ) -> tuple[int, int]:
        base = mf.file_from_offset
        buf = mf.read_buf
        readable = mf.read_position
        limit = min(readable, end - base)
        records = batch.records
        pos = offset - base
        while pos < limit and len(records) < max_records and taken < max_bytes:
            found = read_record(buf, pos, readable, check_crc=check_crc, expected_offset=base + pos)
            if isinstance(found, Record):
                if pos + found.total_size > limit:
                    break  # the caller's end falls inside this record: it is for the next call
                records.append(found)
                pos += found.total_size
                taken += found.total_size
                continue
            if isinstance(found, Blank) and found.total_size == mf.file_size - pos:
                return mf.file_end_offset, taken
            reason = found.reason if isinstance(found, Bad) else "blank of the wrong size"
            resume = find_next_record(buf, pos, readable, base)
            if resume < 0:
                # Nothing valid after it in what is readable of this file: skip to the next.
                batch.corrupt.append(CorruptRange(base + pos, mf.file_end_offset, reason))
                log.error("corrupt commit-log bytes at %d: %s", base + pos, reason)
                return mf.file_end_offset, taken
            batch.corrupt.append(CorruptRange(base + pos, base + resume, reason))
            log.error("corrupt record at %d skipped: %s", base + pos, reason)
            pos = resume
        if pos >= mf.file_size:
            return mf.file_end_offset, taken
        return base + pos, taken

    # -- checkpoint -----------------------------------------------------------------------------

    def _checkpoint(self) -> None:
        """On the flush thread: snapshot the table with the write position, make everything up
        to it durable, then write the checkpoint that vouches for it."""
        with self._put_lock:
            wrote = self.queue.max_wrote_offset()
            if wrote == self._last_checkpoint_offset:
                return
            table = table_to_pairs(self._queue_offsets)
        assert self._flusher is not None
        self._flusher.flush_now()  # a failure here is a flush failure: fatal, as any other
        check(self.queue.flushed_where >= wrote, "checkpoint offset beyond the flushed end")
        try:
            self._write_checkpoint(wrote, table)
        except (OSError, DiskFull) as exc:
            # Nothing was acknowledged on the strength of this file: the data it describes is
            # already flushed. An older checkpoint only makes recovery check more; try again
            # at the next interval instead of stopping writes.
            log.error("checkpoint not written (will retry): %r", exc)

    def _write_checkpoint(self, offset: int, table: dict[QueueKey, int]) -> None:
        self._files.save_checkpoint(
            Checkpoint(
                store_id=self.store_id,
                flushed_offset=offset,
                min_offset=self.min_offset,
                written_at_ms=self.clock.now_ms(),
                queue_offsets=table,
            )
        )
        self._last_checkpoint_offset = offset

    # -- retention ------------------------------------------------------------------------------

    def set_floor_offset(self, provider: Callable[[], int] | None) -> None:
        """Retention never deletes a segment holding bytes at or above `provider()` (the lowest
        confirmed subscriber offset, once subscribers exist)."""
        self._floor_offset = provider

    def clean_expired(self, *, manual: bool = False) -> RetentionReport:
        """One round of retention (the background thread calls this every clean interval)."""
        if not self._running:
            raise Unavailable("the store is not open")
        floor = self._floor_offset() if self._floor_offset is not None else self.max_offset
        report = self._retention.run_once(self.queue, floor_offset=floor, manual=manual)
        self._disk_full_by_ratio = report.disk_full
        return report

    def _start_retention(self) -> None:
        def loop() -> None:
            interval_s = self.config.clean_interval_ms / 1000.0
            while not self._retention_stop.wait(interval_s):
                try:
                    self.clean_expired()
                except Exception:
                    log.exception("retention round failed")

        self._retention_stop.clear()
        self._retention_thread = threading.Thread(target=loop, name="commitlog-clean", daemon=True)
        self._retention_thread.start()

    def _stop_retention(self) -> None:
        self._retention_stop.set()
        if self._retention_thread is not None:
            self._retention_thread.join()
            self._retention_thread = None
