"""The commit log: appends, flush policies, recovery, reads and the dispatch scan.

A library; commitlog_svc's servicer wraps it. Life cycle:

    log = CommitLog(config)          # nothing touched yet
    report = log.open()              # lock, load, recover, checkpoint, abort marker, threads
    log.append_batch([...])          # from any thread; = finish_append(start_append(...))
    log.close()                      # flush, checkpoint, remove the abort marker, unlock

`start_append` writes and publishes; `finish_append` waits (sync flush) until the bytes are
durable. A pipelined stream writes request N+1 while request N waits, so one flush covers both.
With `producer=(id, sequence)` an append is idempotent (producers.py): a retry of a stored
request returns the first result and stores nothing.

Appends take one lock (RocketMQ's putMessageLock). Under it the store assigns queue offsets,
the store timestamp and physical offsets, encodes the batch (record_batch.BatchEncoder: the
limits, the body CRC and, once those fields are final, each record's whole-record CRC), writes
it in place and publishes it with one position update, so a reader sees a batch whole or not at
all. The whole-record CRC covers fields only the lock assigns, so it is computed there, in the
encoder's one compiled pass over the batch (formats/_core_encode.pxi).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from commitlog_svc.append_frames import (
    AppendedRun,
    AppendFrames,
    DispatchProperties,
    dispatch_properties,
)
from commitlog_svc.config import CommitLogConfig, FlushMode
from commitlog_svc.flush import FlushService
from commitlog_svc.messages import AppendResult, PendingAppend, PutStatus
from commitlog_svc.producer_recovery import lower_queue_offsets, rebuild_from_tags
from commitlog_svc.producers import (
    TAG_BYTES_MAX,
    ProducerState,
    ProducerTable,
    check_producer_id,
    check_sequence,
    encode_tag,
)
from commitlog_svc.recovery import CorruptRange, RecoveryReport, recover
from commitlog_svc.retention import RetentionPolicy, RetentionReport
from commitlog_svc.store_files import StoreFiles
from mqstore.errors import (
    CorruptRecord,
    DataLoss,
    DiskFull,
    FailedPrecondition,
    InvalidArgument,
    MqstoreError,
    NotCommitted,
    OutOfRange,
    PropertiesTooLarge,
    Unavailable,
    check,
)
from mqstore.formats.commitlog_checkpoint import (
    Checkpoint,
    ProducerEntry,
    ProducerRequest,
    QueueKey,
    StoreMeta,
)
from mqstore.formats.record import (
    BLANK_MAGIC,
    END_FILE_MIN_BLANK_BYTES,
    MAGIC_V1_BYTES,
    MAGIC_V2_BYTES,
    PHYSICAL_OFFSET_POS,
    Bad,
    Blank,
    Buffer,
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
    table_to_pairs,
    undo_queue_offsets,
)
from mqstore.formats.record_columns import IntArray, check_records
from mqstore.history import LogHistory
from mqstore.storage.clock import Clock, SystemClock
from mqstore.storage.disk import Disk, FileLock, OsDisk
from mqstore.storage.log_repair import repair_hint
from mqstore.storage.mapped_file import MappedFile
from mqstore.storage.mapped_file_queue import MappedFileQueue, ShortSegment, ShortSegmentError
from mqstore.storage.segment_reads import copy_runs
from mqstore.storage.warmer import SegmentWarmer

log = logging.getLogger(__name__)

# After a failed file creation (disk full), appends are refused outright for this long before
# one is let through to try again: a full disk should not cost a failed fallocate per call.
DISK_FULL_RETRY_MS = 1_000

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_BLANK_MAGIC_BYTES = _I32.pack(BLANK_MAGIC)
# A store-level refusal: the status every message of the call gets, and why.
Refusal = tuple[PutStatus, str]


class AckGate(Protocol):
    """What a replicated log's leader checks around each append (replication/controller.py)."""

    def check_append(self) -> None:
        """Before an append is written. Raises NotLeader when this replica may not lead an
        append at all (the producer sends the whole request to the leader), NotEnoughReplicas
        when too few replicas are in sync to acknowledge one (the producer sends it again)."""
        ...

    def replicated(self, end_offset: int) -> tuple[PutStatus, str]:
        """After the local flush: PUT_OK once the append up to `end_offset` may be
        acknowledged, else the status (and reason) to answer instead. Raises NotLeader when
        the term ended first: the producer sends the request again to the new leader, whose
        producer table answers it as a duplicate if the append reached it."""
        ...


# (producer id, sequence, its state) of an idempotent append in progress.
_Producer = tuple[str, int, ProducerState]


@dataclass(slots=True)
class ScanBatch:
    """Records read in order from `start_offset`; continue at `next_offset`."""

    start_offset: int
    next_offset: int
    records: list[Record] = field(default_factory=list)
    corrupt: list[CorruptRange] = field(default_factory=list)


def skip_non_record(
    mf: MappedFile, pos: int, readable: int, found: Blank | Bad
) -> tuple[CorruptRange | None, int]:
    """Where a walk over `mf` goes on after something that is not a record at `pos`, and the
    corrupt range it steps over: (None, file size) at the end-of-file blank; past a bad record,
    the next valid record (or the file's end when nothing valid follows in what is readable).
    Shared by `CommitLog.scan` and the dispatch scan, so both skip corruption alike."""
    if isinstance(found, Blank) and found.total_size == mf.file_size - pos:
        return None, mf.file_size
    reason = found.reason if isinstance(found, Bad) else "blank of the wrong size"
    resume = find_next_record(mf.buf, pos, readable, mf.file_from_offset)
    resume = mf.file_size if resume < 0 else resume
    base = mf.file_from_offset
    return CorruptRange(base + pos, base + resume, reason), resume


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
        self.queue = MappedFileQueue(self.disk, config.commitlog_dir, config.file_bytes)
        self._store_host = config.store_host
        self._limits = config.limits
        self._put_lock = threading.Lock()
        self._put_lock_timeout_s = config.put_lock_timeout_ms / 1000.0
        # Held by a checkpoint round from its snapshot to its write, so that nothing else
        # (a replica's truncation, commitlog_svc/replica.py) writes the checkpoint in between.
        # Taken before the put lock, never after it.
        self._checkpoint_lock = threading.Lock()
        # While set, producers' appends raise what it makes (a follower of a replicated log
        # refuses them: commitlog_svc/replica.py).
        self._refuse_appends: Callable[[], MqstoreError] | None = None
        # A broker group's leader (commitlog_svc/replication/controller.py): refuses appends it
        # may not acknowledge, and answers each only once the in-sync set holds it; and the
        # commit offset, which bounds dispatch. None: a single replica.
        self._ack_gate: AckGate | None = None
        self._commit_bound: Callable[[], int] | None = None
        self._encoder = BatchEncoder(self._store_host, self._limits, record_crc=config.record_crc)
        self._queue_offsets: QueueTable = {}
        self._lock: FileLock | None = None
        self._flusher: FlushService | None = None
        self._warmer: SegmentWarmer | None = None
        self._retention = RetentionPolicy(config, self.disk, self.clock)
        self._retention_thread: threading.Thread | None = None
        self._retention_stop = threading.Event()
        self._floor_offset: Callable[[], int] | None = None
        self.store_id = b""
        # The log's history (mqstore/history.py): a new epoch at every open.
        self.history = LogHistory()
        self.recovery: RecoveryReport | None = None
        self._running = False
        self._flush_failed: BaseException | None = None
        self._disk_full_until_ms = 0.0  # refuse appends until then (monotonic ms)
        self._disk_full_by_ratio = False
        self._last_checkpoint_offset = -1
        self._corrupt_starts: dict[int, str] = {}
        self._producers = ProducerTable(config.producers_max, config.producer_requests_max)
        # Notified whenever the confirm offset may have moved (an append under async flush, a
        # flush) and on close: dispatch waits on it instead of polling.
        self._progress = threading.Condition()
        # Notified after every write, flushed or not (a leader's feed to its followers).
        self._written = threading.Condition()
        self._flush_observers: list[Callable[[float], None]] = []
        self._newest_store_ts = -1  # store time of the newest record; -1 = not known yet
        # Dispatch columns of the newest appends (append_frames.py), for subscribers in step.
        self.appended = AppendFrames(config.append_frames_bytes, config.append_records_bytes)

    # -- life cycle -----------------------------------------------------------------------------

    def open(self, *, retention: bool = False) -> RecoveryReport:
        """Take the lock, load and recover the files, and start the flush thread."""
        check(not self._running, "commit log opened twice")
        self.appended.clear()
        self.disk.makedirs(self.config.data_dir)
        self._lock = self.disk.lock(self._files.lock_path())
        try:
            clean_exit = not self._files.abort_exists()
            short = self._load_segments()
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
            if short is not None:
                result.report.short_segment = short.path
                result.report.short_segment_bytes = short.found_bytes
            self.recovery = result.report
            self._queue_offsets = result.queue_offsets
            partial = self._rebuild_producers(ckpt, result.report.end_offset)
            if partial >= 0:
                self._cut_partial_request(partial, result.report)
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
            self.queue.flush(0)
            self.queue.flushed_where = end
            self._open_history(meta, end)
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
            after_flush=self._after_flush,
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
        if report.short_segment:
            log.warning(
                "the newest segment %s was %d bytes, not %d: extended with zeros and recovered "
                "as a torn tail; the log now ends at %d (%d durable bytes lost)",
                report.short_segment,
                report.short_segment_bytes,
                self.config.file_bytes,
                end,
                report.durable_bytes_lost,
            )
        return report

    def _open_history(self, meta: StoreMeta, end: int) -> None:
        """Every start begins a new epoch at the end of what recovery kept (mqstore/history.py),
        durable before anything is appended or served: whatever a crash may have cut, the next
        writes are never taken for the bytes a follower saw there. (A replica of a broker group
        begins none of its own: replica.py overrides this.)"""
        history = self._load_history(meta)
        # Recovery may have cut below where the last epochs began: they wrote nothing that is
        # left. The new epoch is still newer than all of them (a follower may hold theirs).
        epoch = history.next_epoch()
        self.history = history.compacted(self.queue.min_offset()).truncated(end).begin(epoch, end)
        self._files.save_history(self.store_id, self.history)
        log.info("epoch %d begins at %d", self.history.last_epoch, end)

    def _load_history(self, meta: StoreMeta) -> LogHistory:
        """The history as kept. A damaged epoch file leaves it unknown, so the store takes a
        new id (every follower rebuilds) and an empty history."""
        history = self._files.load_history(
            meta.store_id, min_offset=self.queue.min_offset(), has_data=bool(self.queue.files)
        )
        if history is None:
            meta = self._files.reissue_meta(meta)
            self.store_id = meta.store_id
            log.error("the log's history is lost: new store id %s", meta.store_id.hex())
            history = LogHistory()
        return history

    def _load_segments(self) -> ShortSegment | None:
        """Map the segments; a short newest one is extended (returned, for the report), a
        short older one refuses the start naming it, with the way to repair it."""
        try:
            return self.queue.load(restore_short_last=True)
        except ShortSegmentError as err:
            raise ShortSegmentError(
                f"{err}. {repair_hint(self.config.data_dir)}",
                path=err.path,
                found_bytes=err.found_bytes,
                file_bytes=err.file_bytes,
            ) from err

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
                    end = self.queue.max_offset()
                    self._write_checkpoint(end, table_to_pairs(self._queue_offsets))
                    self._files.remove_abort()
                except Exception:
                    log.exception("shutdown flush failed; the next start recovers the tail")
            flusher.wake()
            self.queue.shutdown()
            if self._lock is not None:
                self._lock.release()
                self._lock = None
        self._notify_progress()

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
        """End of readable data."""
        return self.queue.max_offset()

    @property
    def flushed_offset(self) -> int:
        return self.queue.flushed_where

    @property
    def confirm_offset(self) -> int:
        """How far dispatch may go: the flushed end under sync flush (nothing is visible before
        it is durable), the readable end under async (RocketMQ's getConfirmOffset)."""
        local = (
            self.queue.flushed_where
            if self.config.flush is FlushMode.SYNC
            else self.queue.max_offset()
        )
        bound = self._commit_bound
        return local if bound is None else min(local, bound())

    def set_commit_bound(self, bound: Callable[[], int] | None) -> None:
        """Dispatch and reads stop at `bound()` too: a broker group's commit offset."""
        self._commit_bound = bound

    @property
    def served_end(self) -> int:
        """Where reads stop: the readable end, or a broker group's commit offset when lower
        (a record past it may still be cut by a failover; NotCommitted)."""
        high = self.max_offset
        bound = self._commit_bound
        return high if bound is None else min(high, bound())

    def set_ack_gate(self, gate: AckGate | None) -> None:
        """A replicated log's leader gate (see AckGate); None: acknowledge as a single store."""
        self._ack_gate = gate

    @property
    def writable(self) -> bool:
        return self._refusal() is None

    @property
    def warmed_bytes(self) -> int:
        """Bytes of segments faulted in ahead of the writes so far (see storage/warmer.py)."""
        return self._warmer.warmed_bytes if self._warmer is not None else 0

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

    @property
    def flush_alive(self) -> bool:
        """The flush thread runs and no flush failed (liveness)."""
        flusher = self._flusher
        return (
            self._running and flusher is not None and flusher.alive and self._flush_failed is None
        )

    @property
    def producers(self) -> ProducerTable:
        return self._producers

    def _refusal(self) -> Refusal | None:
        """Why appends are refused right now, if they are. A full disk is
        CREATE_MAPPED_FILE_FAILED ("the log cannot grow"), so that a client can tell it from a
        closed or failed store (SERVICE_NOT_AVAILABLE) and map it to RESOURCE_EXHAUSTED."""
        if not self._running:
            return PutStatus.SERVICE_NOT_AVAILABLE, "the store is not open"
        if self._flush_failed is not None:
            return (
                PutStatus.SERVICE_NOT_AVAILABLE,
                f"a flush failed ({self._flush_failed!r}); writes stop until restart",
            )
        if self._disk_full_by_ratio:
            return PutStatus.CREATE_MAPPED_FILE_FAILED, "disk full: usage is over the warning ratio"
        if self._disk_full_until_ms and self.clock.monotonic_ms() < self._disk_full_until_ms:
            return PutStatus.CREATE_MAPPED_FILE_FAILED, "disk full: no space for a new segment"
        return None

    def _append_refusal(self) -> Refusal | None:
        """_refusal; then a replicated log's leader gate, which raises if it may not append."""
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        gate = self._ack_gate
        if gate is not None:
            gate.check_append()
        return None

    def _on_flush_failure(self, exc: BaseException) -> None:
        self._flush_failed = exc
        self._notify_progress()

    # -- progress (dispatch waits on it) --------------------------------------------------------

    def _notify_progress(self) -> None:
        with self._progress:
            self._progress.notify_all()

    def wake_waiters(self) -> None:
        """Wake every `wait_for_data` and `wait_for_written` (a subscriber or a follower went
        away, the service drains)."""
        self._notify_progress()
        self._notify_written()

    def _notify_written(self) -> None:
        with self._written:
            self._written.notify_all()

    def wait_for_written(self, offset: int, timeout_s: float) -> bool:
        """Block until bytes past `offset` are written (flushed or not: a leader's feed sends
        them to its followers at once), the store closes, someone calls `wake_waiters`, or
        `timeout_s` passes. True if there are bytes past `offset`."""
        with self._written:
            if self.queue.max_offset() > offset or not self._running:
                return self.queue.max_offset() > offset
            self._written.wait(timeout_s)
        return self.queue.max_offset() > offset

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        """Block until the confirm offset passes `offset`, the store closes, someone calls
        `wake_waiters`, or `timeout_s` passes. True if there is data beyond `offset`."""
        with self._progress:
            if self.confirm_offset > offset or not self._running:
                return self.confirm_offset > offset
            self._progress.wait(timeout_s)
        return self.confirm_offset > offset

    def add_flush_observer(self, observer: Callable[[float], None]) -> None:
        """`observer(seconds)` after every flush, on the flush thread; it must not block."""
        self._flush_observers.append(observer)

    def _after_flush(self, seconds: float) -> None:
        if self.config.flush is FlushMode.SYNC:
            self._notify_progress()
        for observer in self._flush_observers:
            try:
                observer(seconds)
            except Exception:  # an observer must never turn into a flush failure
                log.exception("flush observer failed")

    # -- appends --------------------------------------------------------------------------------

    def append_batch(
        self,
        messages: MessageBatch | Sequence[MessageBatch],
        *,
        producer: tuple[str, int] | None = None,
    ) -> AppendResult:
        """Store messages in order; one status per message. Refused messages change nothing;
        the others are written together in one segment and published together.

        Messages come as columnar `MessageBatch`es (one, or several in order). `producer` =
        (producer id, sequence) makes the append idempotent (see producers.py)."""
        return self.finish_append(self.start_append(messages, producer=producer))

    def start_append(
        self,
        messages: MessageBatch | Sequence[MessageBatch],
        *,
        producer: tuple[str, int] | None = None,
    ) -> PendingAppend:
        """Write and publish (or refuse, or recognise a retry); `finish_append` answers.
        Raises InvalidArgument for a bad producer id and FailedPrecondition for a sequence that
        goes backwards."""
        refuse = self._refuse_appends
        if refuse is not None:
            raise refuse()
        batches = (messages,) if isinstance(messages, MessageBatch) else messages
        count = sum(len(b) for b in batches)
        if count == 0:
            return PendingAppend(AppendResult(statuses=[], store_host=self._store_host), -1)
        if count > self._limits.batch_messages_max:
            return self._refused(
                count,
                (
                    PutStatus.MESSAGE_ILLEGAL,
                    f"batch of {count} messages, over the {self._limits.batch_messages_max} limit",
                ),
            )
        if producer is None:
            return self._write(batches, count, None)
        producer_id, sequence = producer
        check_producer_id(producer_id)
        check_sequence(sequence)
        st = self._producers.state(producer_id)
        with st.lock:
            prior = self._producers.check(st, producer_id, sequence)
            if prior is not None:
                return self._replay(prior)
            return self._write(batches, count, (producer_id, sequence, st))

    def finish_append(self, pending: PendingAppend) -> AppendResult:
        """Under sync flush, wait until what the append stored is durable: PUT_OK only then,
        FLUSH_DISK_TIMEOUT / FLUSH_DISK_FAILED for stored messages otherwise."""
        result = pending.result
        if pending.end_offset >= 0 and self.config.flush is FlushMode.SYNC:
            assert self._flusher is not None
            status = self._flusher.wait_durable(
                pending.end_offset, self.config.sync_flush_timeout_ms
            )
            if status is not PutStatus.PUT_OK:
                for i, s in enumerate(result.statuses):
                    if s is PutStatus.PUT_OK:
                        result.statuses[i] = status
                        result.reasons[i] = "not durable: " + status.name
                return result
        gate = self._ack_gate
        if pending.end_offset >= 0 and gate is not None:
            status, reason = gate.replicated(pending.end_offset)
            if status is not PutStatus.PUT_OK:
                for i, s in enumerate(result.statuses):
                    if s is PutStatus.PUT_OK:
                        result.statuses[i] = status
                        result.reasons[i] = f"not replicated: {reason}"
        return result

    def _refused(self, count: int, refusal: Refusal) -> PendingAppend:
        result = AppendResult.refused(count, *refusal)
        result.store_host = self._store_host
        return PendingAppend(result, -1)

    def _write(
        self, batches: Sequence[MessageBatch], count: int, producer: _Producer | None
    ) -> PendingAppend:
        refusal = self._append_refusal()
        if refusal is not None:
            return self._refused(count, refusal)
        if not self._put_lock.acquire(timeout=self._put_lock_timeout_s):
            return self._refused(
                count, (PutStatus.OS_PAGE_CACHE_BUSY, "the write lock was busy past the bound")
            )
        props = dispatch_properties(batches) if self.appended.enabled else None
        try:
            result, end = self._append_locked(batches, count, producer, props)
        finally:
            self._put_lock.release()
        if end >= 0:
            self._notify_written()
        if end >= 0 and self.config.flush is FlushMode.ASYNC:
            self._notify_progress()  # visible now; under sync flush, once flushed
        return PendingAppend(result, end)

    def _append_locked(
        self,
        batches: Sequence[MessageBatch],
        count: int,
        producer: _Producer | None,
        props: DispatchProperties | None = None,
    ) -> tuple[AppendResult, int]:
        """Under the put lock: encode (assigning queue offsets), place, write, publish.
        Returns the result and the end offset of what was written (-1 if nothing)."""
        refuse = self._refuse_appends
        if refuse is not None:
            raise refuse()  # set under the put lock: checked again now that it is held
        refusal = self._append_refusal()
        if refusal is not None:
            return AppendResult.refused(count, *refusal), -1
        try:
            mf = self.queue.get_last_mapped_file(0)
        except DiskFull as exc:
            return self._disk_full(count, exc), -1
        assert mf is not None
        store_ts = self.clock.now_ms()
        base = mf.file_from_offset + mf.wrote_position
        if producer is None:
            encoded = self._encode(batches, base, store_ts)
        else:
            encoded = self._encode_tagged(batches, count, producer, base, store_ts)
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
        mf.buf[pos : pos + nbytes] = encoded.blob
        mf.store_timestamp_ms = store_ts
        mf.advance(nbytes)
        self._newest_store_ts = store_ts
        end = encoded.base_offset + nbytes
        result = self._result(encoded, store_ts)
        if props is not None and not encoded.refused:
            self.appended.add(_run(batches, encoded, result.offsets, end, store_ts, props))
        if producer is not None:
            producer_id, sequence, st = producer
            self._producers.record(
                producer_id,
                st,
                ProducerRequest(
                    sequence,
                    count,
                    encoded.offsets[0],
                    end,
                    tuple((i, _refusal_status(err).value) for i, err in encoded.refused),
                ),
            )
        return result, end

    def _encode(self, batches: Sequence[MessageBatch], base: int, store_ts: int) -> EncodedBatch:
        return self._encoder.encode(
            batches,
            base_offset=base,
            store_timestamp_ms=store_ts,
            queue_table=self._queue_offsets,
        )

    def _encode_tagged(
        self,
        batches: Sequence[MessageBatch],
        count: int,
        producer: _Producer,
        base: int,
        store_ts: int,
    ) -> EncodedBatch:
        """Encode with the MQS_PSEQ tag on the first stored message (producers.py).

        The common case costs one encode: the tag goes on message 0 and nothing is refused.
        When messages are refused, the tag moves to the first accepted one and lists the
        refusals (a second encode). If that changes what is refused (the tag itself pushed a
        message over a limit), the batch is stored untagged: the retry is then recognised
        only while this process lives."""
        producer_id, sequence, _ = producer
        first = self._encode(
            _with_property(batches, 0, encode_tag(producer_id, sequence, count)), base, store_ts
        )
        if not first.refused:
            return first
        undo_queue_offsets(batches, first, self._queue_offsets)
        refused = tuple((i, _refusal_status(err).value) for i, err in first.refused)
        accepted = first.accepted()
        tag = encode_tag(producer_id, sequence, count, refused)
        if accepted and len(tag) <= TAG_BYTES_MAX:
            second = self._encode(_with_property(batches, accepted[0], tag), base, store_ts)
            if [i for i, _ in second.refused] == [i for i, _ in first.refused]:
                return second
            undo_queue_offsets(batches, second, self._queue_offsets)
        plain = self._encode(batches, base, store_ts)
        if plain.count > len(plain.refused):
            log.warning(
                "producer %r sequence %d stored without its idempotence tag (%d refusals); "
                "a retry after a restart would be stored again",
                producer_id,
                sequence,
                len(plain.refused),
            )
        return plain

    def _replay(self, prior: ProducerRequest) -> PendingAppend:
        """The result of a stored request, rebuilt from its records (a retry)."""
        stored = prior.count - len(prior.refused)
        if prior.first_offset < self.min_offset:
            raise FailedPrecondition(
                f"the records of sequence {prior.sequence} expired from the log; its outcome "
                "cannot be reported any more"
            )
        if prior.end_offset > self.max_offset:
            raise Unavailable(f"sequence {prior.sequence} is not readable yet; retry shortly")
        found = self.scan(
            prior.first_offset,
            end_offset=prior.end_offset,
            max_records=stored,
            max_bytes=1 << 62,
        )
        records = found.records
        if len(records) != stored or found.corrupt or found.next_offset != prior.end_offset:
            raise DataLoss(
                f"the records of sequence {prior.sequence} at [{prior.first_offset}, "
                f"{prior.end_offset}) cannot be read back"
            )
        refused = dict(prior.refused)
        result = AppendResult(
            statuses=[],
            store_timestamp_ms=records[0].store_timestamp_ms,
            store_host=records[0].store_host,
            duplicate=True,
        )
        it = iter(records)
        for i in range(prior.count):
            status = refused.get(i)
            if status is not None:
                put = PutStatus(status)
                result.statuses.append(put)
                result.offsets.append(-1)
                result.sizes.append(0)
                result.queue_offsets.append(-1)
                result.reasons.append(
                    f"refused ({put.name}) when sequence {prior.sequence} was first stored"
                )
                result.fields.append("")
                continue
            record = next(it)
            result.statuses.append(PutStatus.PUT_OK)
            result.offsets.append(record.physical_offset)
            result.sizes.append(record.total_size)
            result.queue_offsets.append(record.queue_offset)
            result.reasons.append("")
            result.fields.append("")
        return PendingAppend(result, prior.end_offset)

    def _result(self, encoded: EncodedBatch, store_ts: int) -> AppendResult:
        offsets = encoded.offsets
        if not encoded.refused:
            return AppendResult(
                statuses=[PutStatus.PUT_OK] * encoded.count,
                offsets=offsets,
                sizes=encoded.sizes,
                queue_offsets=list(encoded.queue_offsets),
                store_timestamp_ms=store_ts,
                reasons=[""] * encoded.count,
                store_host=self._store_host,
            )
        result = AppendResult.refused(encoded.count, PutStatus.PUT_OK, "")
        result.store_timestamp_ms = store_ts
        result.store_host = self._store_host
        result.fields = [""] * encoded.count
        for i, error in encoded.refused:
            result.statuses[i] = _refusal_status(error)
            result.reasons[i] = str(error)
            result.fields[i] = error.field
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
            mf.buf[pos : pos + END_FILE_MIN_BLANK_BYTES] = encode_blank(remaining)
            mf.advance(remaining)
        return nxt

    def _disk_full(self, count: int, exc: DiskFull) -> AppendResult:
        log.error("cannot create a commit-log segment: %s", exc)
        self._disk_full_until_ms = self.clock.monotonic_ms() + DISK_FULL_RETRY_MS
        return AppendResult.refused(count, PutStatus.CREATE_MAPPED_FILE_FAILED, f"disk full: {exc}")

    def set_store_host(self, store_host: bytes) -> None:
        """Change the host written into new records and msg ids (a service learns its port
        only once it listens, after recovery)."""
        encoder = BatchEncoder(store_host, self._limits, record_crc=self.config.record_crc)
        with self._put_lock:
            self._store_host = store_host
            self._encoder = encoder

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
        if pos + size > mf.wrote_position:
            raise OutOfRange(f"range [{offset}, {offset + size}) runs past readable data")
        return mf.read(pos, size)

    def read_record(self, offset: int) -> Record:
        """The record starting at `offset`, CRC-checked. InvalidArgument if no record starts
        there, CorruptRecord (DATA_LOSS) if the one there fails its checks (a record whose
        magic code was damaged too: its PHYSICALOFFSET field still says it started there).
        NotCommitted for a record past served_end."""
        served_end = self.served_end
        if offset >= served_end:
            raise _not_served(offset, served_end, self.max_offset)
        mf = self._file_at(offset)
        if not mf.hold():
            raise DataLoss(f"the segment holding {offset} was deleted")
        try:
            pos = offset - mf.file_from_offset
            found = read_record(
                mf.buf, pos, mf.wrote_position, check_crc=True, expected_offset=offset
            )
            own_offset = _holds_own_offset(mf.buf, pos, mf.wrote_position, offset)
        finally:
            mf.release()
        if isinstance(found, Record):
            if offset + found.total_size > served_end:
                raise _not_served(offset, served_end, self.max_offset)
            return found
        known = self._corrupt_starts.get(offset)
        if known is not None:
            raise CorruptRecord(offset, known)
        if isinstance(found, Blank) or (found.no_record and not own_offset):
            raise InvalidArgument(f"no record starts at offset {offset}", field="offset")
        raise CorruptRecord(offset, found.reason)

    def segment_start(self, offset: int) -> int:
        """The start of the segment holding `offset`: a record boundary (records never span
        segments)."""
        return offset - offset % self.config.file_bytes

    def starts_record(self, offset: int) -> bool:
        """Whether `offset` is a record boundary: one every reader knows (the log's ends, a
        segment's start, an epoch's start, a damaged record recovery found), or the start of
        an intact record (its CRC and its own offset field agree) or of the end-of-file blank."""
        if (
            offset in (self.min_offset, self.max_offset)
            or offset % self.config.file_bytes == 0
            or offset in self.history.starts
            or offset in self._corrupt_starts
        ):
            return True
        try:
            mf = self._file_at(offset)
        except OutOfRange:
            return False
        if not mf.hold():
            return False
        try:
            pos = offset - mf.file_from_offset
            found = read_record(
                mf.buf, pos, mf.wrote_position, check_crc=True, expected_offset=offset
            )
        finally:
            mf.release()
        return isinstance(found, (Record, Blank))

    def read_blob(
        self, offsets: Sequence[int] | IntArray, sizes: Sequence[int] | IntArray
    ) -> tuple[bytes, IntArray, dict[int, MqstoreError]]:
        """Raw bytes of whole records, each range (offsets[i], sizes[i]) checked to be one intact
        record and answered on its own, without an object per record: (the records served, laid
        end to end in request order; each range's size in that blob, 0 where it was not served;
        the error of each range not served, by its index: OutOfRange when expired, not written
        yet or past readable data, DataLoss when its segment was deleted under the read,
        CorruptRecord).

        The ranges are checked as columns. A segment is held once; ranges that follow each other
        in it (offset[i] + size[i] == offset[i+1]) are copied out as one slice, and the copies
        are checked together (record_columns.check_records: read_record's checks and verdicts,
        compiled); the records that fail are cut out of the blob: nothing damaged is ever
        served."""
        off = np.asarray(offsets, dtype=np.int64)
        size = np.asarray(sizes, dtype=np.int64)
        check(off.shape == size.shape and off.ndim == 1, "one size for every offset")
        low, high, served_end = self.min_offset, self.max_offset, self.served_end
        errors: dict[int, MqstoreError] = {}
        wanted = (size > 0) & (off >= low) & (off < high) & (off + size <= served_end)
        for i in np.flatnonzero(~wanted).tolist():
            offset, nbytes = int(off[i]), int(size[i])
            if nbytes <= 0:
                errors[i] = InvalidArgument(f"size must be positive, got {nbytes}")
            elif low <= offset < high:
                errors[i] = _not_served(offset, served_end, high)
            else:
                errors[i] = OutOfRange(f"offset {offset} is outside the log [{low}, {high})")
        served = np.zeros(len(off), dtype=np.int64)
        pieces = self._copy_ranges(off, size, np.flatnonzero(wanted), served, errors)
        blob = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return self._checked_blob(bytes(blob), off, served, errors), served, errors

    def _copy_ranges(
        self,
        off: IntArray,
        size: IntArray,
        wanted: IntArray,
        served: IntArray,
        errors: dict[int, MqstoreError],
    ) -> list[bytes | bytearray]:
        """Copies of the ranges `wanted` (indices, in request order), a slice per run of ranges
        that follow each other in a segment. Sets `served` to the size of each range copied, and
        the error of each range that could not be."""
        pieces: list[bytes | bytearray] = []
        file_size = self.queue.file_size
        group_starts = np.flatnonzero(np.diff(off[wanted] // file_size)) + 1
        held: dict[int, MappedFile] = {}
        try:
            for members in np.split(wanted, group_starts.tolist()) if len(wanted) else []:
                first = int(off[members[0]])
                mf = self.queue.find_mapped_file_by_offset(first)
                if mf is None:
                    for i in members.tolist():
                        errors[i] = OutOfRange(f"no segment holds offset {int(off[i])}")
                    continue
                if mf.file_from_offset not in held:
                    if not mf.hold():
                        for i in members.tolist():
                            errors[i] = DataLoss(f"the segment holding {int(off[i])} was deleted")
                        continue
                    held[mf.file_from_offset] = mf
                group = members
                begin = off[group] - mf.file_from_offset
                end = begin + size[group]
                readable = end <= mf.wrote_position
                if not readable.all():
                    for i in members[~readable].tolist():
                        at, nbytes = int(off[i]), int(size[i])
                        errors[i] = OutOfRange(f"[{at}, {at + nbytes}) runs past readable data")
                    group, begin, end = members[readable], begin[readable], end[readable]
                    if not len(group):
                        continue
                pieces.extend(copy_runs(mf.buf, begin, end))
                served[group] = size[group]
        finally:
            for mf in held.values():
                mf.release()
        return pieces

    def _checked_blob(
        self, blob: bytes, off: IntArray, served: IntArray, errors: dict[int, MqstoreError]
    ) -> bytes:
        """`blob` (the ranges with a size in `served`, end to end) without the records that fail
        read_record's checks (record_columns.check_records): each gets its CorruptRecord in
        `errors` and size 0 in `served`."""
        read = np.flatnonzero(served)
        checked = check_records(blob, served[read], off[read], bodies=False)
        if checked.ok:
            return blob
        failed = dict(checked.failed)
        for k, reason in failed.items():
            i = int(read[k])
            errors[i] = CorruptRecord(int(off[i]), reason)
            served[i] = 0
        starts, ends = checked.starts.tolist(), checked.ends.tolist()
        return b"".join(blob[starts[k] : ends[k]] for k in range(len(read)) if k not in failed)

    def scan(
        self,
        from_offset: int,
        *,
        max_records: int = 1024,
        max_bytes: int = 4 << 20,
        end_offset: int | None = None,
        check_crc: bool = True,
    ) -> ScanBatch:
        """Records from `from_offset` (a record boundary) up to `end_offset` (default: the
        confirm offset), at most `max_records` / about `max_bytes`, each checked as
        read_record checks it (CRCs too unless `check_crc` is False). The reference dispatch
        source (dispatch_scan.py makes the same frames faster).

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
        buf = mf.buf
        readable = mf.wrote_position
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
            corrupt, pos = skip_non_record(mf, pos, readable, found)
            if corrupt is not None:
                batch.corrupt.append(corrupt)
                log.error(
                    "corrupt commit-log bytes [%d, %d) skipped: %s",
                    corrupt.start_offset,
                    corrupt.end_offset,
                    corrupt.reason,
                )
        if pos >= mf.file_size:
            return mf.file_end_offset, taken
        return base + pos, taken

    # -- checkpoint -----------------------------------------------------------------------------

    def _checkpoint(self) -> None:
        """On the flush thread: snapshot the table with the write position, make everything up
        to it durable, then write the checkpoint that vouches for it."""
        with self._checkpoint_lock:
            with self._put_lock:
                wrote = self.queue.max_offset()
                if wrote == self._last_checkpoint_offset:
                    return
                table = table_to_pairs(self._queue_offsets)
                producers = self._producers.snapshot()
            assert self._flusher is not None
            self._flusher.flush_now()  # a failure here is a flush failure: fatal, as any other
            check(self.queue.flushed_where >= wrote, "checkpoint offset beyond the flushed end")
            try:
                self._write_checkpoint(wrote, table, producers)
            except (OSError, DiskFull) as exc:
                # Nothing was acknowledged on the strength of this file: the data it describes
                # is already flushed. An older checkpoint only makes recovery check more; try
                # again at the next interval instead of stopping writes.
                log.error("checkpoint not written (will retry): %r", exc)

    def _write_checkpoint(
        self,
        offset: int,
        table: dict[QueueKey, int],
        producers: list[ProducerEntry] | None = None,
    ) -> None:
        self._files.save_checkpoint(
            Checkpoint(
                store_id=self.store_id,
                flushed_offset=offset,
                min_offset=self.min_offset,
                written_at_ms=self.clock.now_ms(),
                queue_offsets=table,
                producers=self._producers.snapshot() if producers is None else producers,
            )
        )
        self._last_checkpoint_offset = offset

    # -- producer table on recovery -------------------------------------------------------------

    def _rebuild_producers(self, ckpt: Checkpoint | None, end: int) -> int:
        """The checkpoint's snapshot, then the tags of the records after its offset (see
        producer_recovery.py). Returns where an idempotent request that survived only in part
        begins (-1: none did)."""
        dropped = self._producers.load(ckpt.producers if ckpt else [], end_offset=end)
        if dropped:
            log.warning("%d remembered producer requests were cut by recovery", dropped)
        start = max(ckpt.flushed_offset if ckpt is not None else 0, self.min_offset)
        return rebuild_from_tags(self.queue, self._producers, start, end)

    def _cut_partial_request(self, start: int, report: RecoveryReport) -> None:
        """An idempotent request survived a crash only in part: cut it whole, so that its
        retry stores every message once (producer_recovery.py)."""
        end = report.end_offset
        lower_queue_offsets(self.queue, self._queue_offsets, start, end)
        self.queue.truncate_dirty_files(start)
        log.warning(
            "an idempotent request survived the crash only in part: cut its records [%d, %d) "
            "so that its retry stores it whole",
            start,
            end,
        )
        report.truncated_bytes += end - start
        report.end_offset = start
        report.corrupt = [c for c in report.corrupt if c.start_offset < start]

    # -- what GetStatus reports -----------------------------------------------------------------

    def newest_store_timestamp_ms(self) -> int:
        """Store time of the newest record (-1 for an empty log)."""
        if self._newest_store_ts < 0:
            last = self._last_record()
            if last is not None:
                self._newest_store_ts = max(self._newest_store_ts, last.store_timestamp_ms)
        return self._newest_store_ts

    def store_timestamp_at(self, offset: int) -> int:
        """Store time of the first record at or after `offset` (-1 if none is readable)."""
        end = self.max_offset
        offset = max(offset, self.min_offset)
        while offset < end:
            try:
                found = self.scan(offset, end_offset=end, max_records=1)
            except OutOfRange:
                offset = self.min_offset
                continue
            if found.records:
                return found.records[0].store_timestamp_ms
            if found.next_offset <= offset:
                break
            offset = found.next_offset
        return -1

    def _last_record(self) -> Record | None:
        end = self.max_offset
        for mf in reversed(list(self.queue.files)):
            if mf.file_from_offset >= end or not mf.hold():
                continue
            try:
                limit = min(end - mf.file_from_offset, mf.wrote_position)
                found = _last_record_in(mf.buf, limit, mf.file_from_offset, mf.file_size)
            finally:
                mf.release()
            if found is not None:
                return found
        return None

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


def _run(
    batches: Sequence[MessageBatch],
    encoded: EncodedBatch,
    offsets: list[int],
    end: int,
    store_ts: int,
    props: DispatchProperties,
) -> AppendedRun:
    """The dispatch entries of an append that stored every message, as append_frames holds
    them."""
    if len(batches) == 1:
        topics = [batches[0].topic]
        indexes = None
    else:
        table: dict[str, int] = {}
        indexes = []
        for b in batches:
            indexes.extend([table.setdefault(b.topic, len(table))] * len(b))
        topics = list(table)
    return AppendedRun(
        offsets,
        end,
        topics,
        indexes,
        # a copy (the caller owns its lists), made by list() at C speed
        list(itertools.chain.from_iterable(b.queue_ids for b in batches)),
        encoded.queue_offsets,
        encoded.sizes,
        store_ts,
        encoded.sys_flags,
        props,
        encoded.blob if isinstance(encoded.blob, bytes) else bytes(encoded.blob),
    )


def _refusal_status(error: InvalidArgument) -> PutStatus:
    if isinstance(error, PropertiesTooLarge):
        return PutStatus.PROPERTIES_SIZE_EXCEEDED
    return PutStatus.MESSAGE_ILLEGAL


def _with_property(batches: Sequence[MessageBatch], index: int, extra: bytes) -> list[MessageBatch]:
    """The batches with `extra` appended to the properties of message `index` (counted across
    the batches). Copies one batch and its properties column; the others are shared."""
    out = list(batches)
    for k, batch in enumerate(out):
        n = len(batch)
        if index < n:
            props = list(batch.properties) if batch.properties is not None else [b""] * n
            props[index] = bytes(props[index]) + extra
            out[k] = dataclasses.replace(batch, properties=props)
            return out
        index -= n
    raise InvalidArgument(f"message {index} is not in the batch")


def _not_served(offset: int, served_end: int, high: int) -> OutOfRange:
    if served_end < high:
        return NotCommitted(
            f"the record at {offset} is not yet held by the whole in-sync set (commit offset "
            f"{served_end}); retry shortly"
        )
    return OutOfRange(f"[{offset}, ...) runs past readable data (end {high})")


def _holds_own_offset(buf: Buffer, pos: int, readable: int, offset: int) -> bool:
    """The PHYSICALOFFSET field at `pos` holds `offset`: a record was written there, whatever
    became of its magic code (only the record at that place writes that number there)."""
    at = pos + PHYSICAL_OFFSET_POS
    return at + 8 <= readable and _I64.unpack_from(buf, at)[0] == offset


def _last_record_in(buf: Buffer, limit: int, base: int, file_size: int) -> Record | None:
    """The record ending exactly at `limit` in one segment (its newest), found from the end:
    magic codes are searched backwards and each candidate must parse as a whole record whose
    offset field matches its position. A full segment ends with the blank; the records end
    where it starts."""
    view = bytes(buf[0:limit]) if isinstance(buf, memoryview) else buf
    if limit == file_size:
        p = view.rfind(_BLANK_MAGIC_BYTES, 0, limit)
        while p >= 4:
            (total,) = _I32.unpack_from(view, p - 4)
            if total == file_size - (p - 4):
                limit = p - 4
                break
            p = view.rfind(_BLANK_MAGIC_BYTES, 0, p + 3)
        else:
            return None
    hi = limit
    while True:
        p = max(view.rfind(MAGIC_V1_BYTES, 0, hi), view.rfind(MAGIC_V2_BYTES, 0, hi))
        if p < 4:
            return None
        start = p - 4
        found = read_record(view, start, limit, check_crc=True, expected_offset=base + start)
        if isinstance(found, Record) and start + found.total_size == limit:
            return found
        hi = p + 3
