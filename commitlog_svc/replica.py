"""One replica of a broker group's commit log: the storage side of replication (issue 24).

    role       producers' appends      replicated bytes, truncate, start_at
    follower   refused: NotLeader      taken
    leader     taken                   refused: NotFollower

A replica opens as a follower and begins no epoch of its own (a single-replica store,
commitlog.CommitLog, begins one at every open, as before). The service makes it the leader
(`become_leader(epoch)`: that epoch begins at its end) and a follower again
(`become_follower(leader)`). What a replication stream calls:

    leader                                       follower
    agreed_offset(its history, its end)     ──▶  truncate(agreed)         (on connecting)
    log_start()                             ──▶  start_at(start)          (when it holds
                                                    nothing the leader still has: it begins
                                                    at the leader's first segment)
    read_chunk(its end, max_bytes, limit)   ──▶  append_replicated(chunk) -> its new end
                                                 wait_durable(offset, timeout) -> durable end

A follower keeps what the leader keeps: the same bytes at the same offsets (segment files
byte-identical, end-of-segment blanks included), the queue-offset and producer tables raised by
each chunk's records exactly as recovery raises them (so a promoted follower answers a retried
request as a duplicate), the leader's epochs (each adopted, durably, before any byte it wrote
becomes visible), and its own checkpoints and flushes (its flush policy).

Truncation is crash-safe: a kill -9 or a power loss at any step leaves a log that recovery
opens at the cut or at the old end, nothing else (recovery.py's decision table):

    step                                        what recovery finds after a crash there
    1 flush everything                          the old log
    2 checkpoint: F = the cut, tables at it     the old log: it checks what lies past F and
                                                raises the tables back from those records
    3 zero the segment from the cut, flush      zeros at the cut, at or past F: a torn tail,
                                                cut there (later segments go)
    4 delete the later segments, fsync the dir  the cut
    5 epochs that began at or past the cut go   the cut (an open keeps an epoch that began at
                                                the end; the next handshake's truncate drops
                                                it, even with no byte left to cut)

A half-done truncation never leaves a log recovery would take for "corruption in the middle"
with later records kept: the checkpoint moves below the cut before any byte changes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import CommitLogConfig, FlushMode
from commitlog_svc.messages import PutStatus
from commitlog_svc.producer_recovery import lower_queue_offsets
from commitlog_svc.replica_chunk import (
    CHUNK_BYTES_MAX,
    CheckedChunk,
    Chunk,
    LogStart,
    check_chunk,
    chunk_end,
    epochs_covering,
    tagged_requests,
)
from mqstore.errors import (
    ChunkRefused,
    DiskFull,
    FailedPrecondition,
    HistoryMismatch,
    InvalidArgument,
    NotFollower,
    NotLeader,
    OutOfRange,
    ReplicaOffsetMismatch,
    StaleEpoch,
    StoreIdMismatch,
    Unavailable,
)
from mqstore.formats.commitlog_checkpoint import ProducerEntry, ProducerRequest, StoreMeta
from mqstore.formats.record_batch import table_from_pairs, table_to_pairs
from mqstore.history import Epoch, LogHistory
from mqstore.storage import failpoints
from mqstore.storage.clock import Clock
from mqstore.storage.disk import Disk
from mqstore.storage.mapped_file import MappedFile

log = logging.getLogger(__name__)


class ReplicaLog(CommitLog):
    """A commit log that is one replica of a broker group (see the module docstring). Without
    a group it is never made the leader; `CommitLog` is the single-replica store."""

    def __init__(
        self,
        config: CommitLogConfig,
        *,
        disk: Disk | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(config, disk=disk, clock=clock)
        self._leads = False
        self._leader = ""  # who leads, as the service names it (for NotLeader)
        self._refuse_appends = self._not_leader
        self._durable = threading.Condition()  # notified after every flush and cut
        self.add_flush_observer(self._flushed)

    # -- life cycle -----------------------------------------------------------------------------

    def _open_history(self, meta: StoreMeta, end: int) -> None:
        """A replica begins no epoch when it opens: its epochs are the leader's (adopted with
        the bytes they wrote) or the one it begins when it leads. Epochs that began past what
        recovery kept go; one that began at the end stays (it is the replica's last)."""
        loaded = self._load_history(meta)
        history = loaded.compacted(self.queue.min_offset()).truncated(end + 1)
        self.history = history
        self._files.save_history(self.store_id, history)
        log.info("replica opens in epoch %d at %d (a follower)", history.last_epoch, end)

    def close(self) -> None:
        super().close()
        self._notify_durable()

    # -- role -----------------------------------------------------------------------------------

    @property
    def leads(self) -> bool:
        return self._leads

    def become_follower(self, leader: str = "") -> None:
        """Refuse producers' appends from now on (each raises NotLeader naming `leader`) and
        take replicated bytes. Appends already written stay; what the stream does with them is
        the service's (a new leader's history truncates what it does not hold)."""
        with self._put_lock:
            self._leads = False
            self._leader = leader
            self._refuse_appends = self._not_leader

    def become_leader(self, epoch: int) -> int:
        """Begin `epoch` at the end of the log, durably, then take producers' appends. The
        epoch must be newer than every one in the history (the service passes max(the group's
        last epoch, this replica's) + 1). Returns the offset where it begins."""
        with self._checkpoint_lock, self._put_lock:
            self._check_open()
            if epoch <= self.history.last_epoch:
                raise StaleEpoch(
                    f"epoch {epoch} is not newer than this replica's last epoch "
                    f"{self.history.last_epoch}"
                )
            end = self.max_offset
            history = self.history.begin(epoch, end)
            self._files.save_history(self.store_id, history)
            self.history = history
            self._leads = True
            self._leader = ""
            self._refuse_appends = None
        log.info("this replica leads: epoch %d begins at %d", epoch, end)
        return end

    def _not_leader(self) -> NotLeader:
        leader = self._leader
        where = f"the leader {leader}" if leader else "the leader (not known here yet)"
        return NotLeader(f"this replica is a follower: producers append to {where}", leader=leader)

    def _check_follower(self) -> None:
        if self._leads:
            raise NotFollower("this replica leads: it takes no replicated bytes")

    def _check_open(self) -> None:
        if not self._running:
            raise Unavailable("the store is not open")

    def _check_writable(self) -> None:
        refusal = self._refusal()
        if refusal is None:
            return
        status, reason = refusal
        if status is PutStatus.CREATE_MAPPED_FILE_FAILED:
            raise DiskFull(reason)
        raise Unavailable(reason)

    # -- identity -------------------------------------------------------------------------------

    def adopt_store_id(self, store_id: bytes) -> None:
        """Take the group's log identity. An empty replica (it holds no byte) adopts it, with
        an empty history and empty tables; one holding bytes of another log is refused."""
        with self._checkpoint_lock, self._put_lock:
            self._check_open()
            if store_id == self.store_id:
                return
            low, end = self.min_offset, self.max_offset
            if end != low:
                raise StoreIdMismatch(
                    f"this replica holds [{low}, {end}) of the log {self.store_id.hex()}, not of "
                    f"its group's log {store_id.hex()}; it can join only empty (move its data "
                    "directory away first)"
                )
            meta = self._files.load_or_create_meta(
                has_data=bool(self.queue.files),
                now_ms=self.clock.now_ms(),
                file_bytes=self.config.file_bytes,
            )
            self._files.adopt_meta(meta, store_id)
            self.store_id = store_id
            self.history = LogHistory()
            self._files.save_history(store_id, self.history)
            self._queue_offsets = {}
            self._producers.load([], end_offset=end)
            self._write_checkpoint(end, {}, [])
        log.info("replica adopted the group's store id %s", store_id.hex())

    # -- the leader's side ----------------------------------------------------------------------

    def read_chunk(
        self,
        offset: int,
        *,
        max_bytes: int = CHUNK_BYTES_MAX,
        limit_offset: int | None = None,
    ) -> Chunk:
        """The next chunk of this log for a follower whose log ends at `offset`: whole records
        (and the end-of-segment blank), about `max_bytes` at most (one record or idempotent
        request longer than that goes whole), never past `limit_offset` (default: the readable
        end; it must be a record boundary, as the written and the flushed ends are). Empty
        when there is nothing to send. OutOfRange when `offset` is below the first segment
        (the follower starts again: log_start) or past the end (it must truncate first)."""
        if max_bytes <= 0:
            raise InvalidArgument(f"max_bytes must be positive, got {max_bytes}", field="max_bytes")
        history = self.history
        low, high = self.min_offset, self.max_offset
        limit = high if limit_offset is None else min(limit_offset, high)
        if offset < low:
            raise OutOfRange(
                f"offset {offset} is below this log's first segment at {low}: the follower "
                "starts again there"
            )
        if offset > high:
            raise OutOfRange(
                f"offset {offset} is past this log's end {high}: the follower holds bytes this "
                "log does not, and must truncate to the agreed offset first"
            )
        if offset >= limit:
            return Chunk(offset, b"", offset, epochs_covering(history, offset, offset))
        mf = self.queue.find_mapped_file_by_offset(offset)
        if mf is None or not mf.hold():
            raise OutOfRange(f"the segment holding {offset} was deleted under the read")
        try:
            base = mf.file_from_offset
            pos = offset - base
            closed = limit >= mf.file_end_offset
            data_end = mf.file_size if closed else limit - base
            end, blank = chunk_end(
                mf.buf, pos, data_end, base, mf.file_size, max_bytes, closed=closed
            )
            data = mf.read(pos, end - pos)
        finally:
            mf.release()
        next_offset = mf.file_end_offset if blank else base + end
        return Chunk(offset, data, next_offset, epochs_covering(history, offset, next_offset))

    def log_start(self) -> LogStart:
        """Where a follower holding nothing of this log begins, with the tables it starts from
        (see LogStart)."""
        with self._put_lock:
            return LogStart(
                offset=self.min_offset,
                taken_at=self.max_offset,
                queue_offsets=table_to_pairs(self._queue_offsets),
                producers=self._producers.snapshot(),
            )

    def agreed_offset(self, history: LogHistory, end_offset: int) -> int:
        """Where a follower whose log ends at `end_offset` with `history` agrees with this log:
        it truncates there (never past this log's end), then copies from there."""
        return self.history.agreed_offset(history, min(end_offset, self.max_offset))

    # -- the follower's side --------------------------------------------------------------------

    @property
    def end_offset(self) -> int:
        """Where the next replicated bytes go: the end of what this replica received."""
        return self.max_offset

    @property
    def durable_offset(self) -> int:
        """The end of what is on disk (flushed by this replica's own policy)."""
        return self.flushed_offset

    def append_replicated(self, chunk: Chunk) -> int:
        """Store a chunk of the leader's log at this log's end; returns the new end.

        Nothing of it is stored unless it all passes: `chunk.offset` must be this log's end
        (ReplicaOffsetMismatch), every record recovery's checks (ChunkRefused), and its epochs
        must agree with this history (HistoryMismatch). The leader's epochs it reaches are
        adopted, durably, before its bytes become visible; the tables move as the records
        say; the bytes are flushed by this replica's flush policy (wait_durable)."""
        with self._put_lock:
            self._check_open()
            self._check_follower()
            self._check_writable()
            end = self.max_offset
            if chunk.offset != end:
                raise ReplicaOffsetMismatch(chunk.offset, end)
            checked = check_chunk(chunk.data, chunk.offset, self.config.file_bytes)
            if checked.next_offset != chunk.next_offset:
                raise ChunkRefused(
                    chunk.offset,
                    f"its bytes end the log at {checked.next_offset}, the chunk says "
                    f"{chunk.next_offset} (a different segment size?)",
                )
            if chunk.data and not (chunk.epochs and chunk.epochs[0].start_offset <= chunk.offset):
                raise InvalidArgument(
                    "a chunk carries the leader's epochs covering its bytes", field="epochs"
                )
            history = self._adopted(chunk.epochs, chunk.offset, checked.next_offset)
            mf = self._segment_for(end) if chunk.data else None
            if history != self.history:
                self._files.save_history(self.store_id, history)  # durable before the bytes
                self.history = history
            if mf is not None:
                self._store(mf, chunk.data, checked)
            new_end = self.max_offset
        if self.config.flush is FlushMode.SYNC:
            assert self._flusher is not None
            self._flusher.request(new_end)
        else:
            self._notify_progress()
        return new_end

    def _segment_for(self, end: int) -> MappedFile:
        try:
            mf = self.queue.get_last_mapped_file(end)
        except DiskFull as exc:
            self._disk_full(0, exc)
            raise
        assert mf is not None and mf.file_from_offset + mf.wrote_position == end
        return mf

    def _adopted(self, epochs: Sequence[Epoch], offset: int, reached: int) -> LogHistory:
        """This history holding the leader's epochs for the bytes [offset, reached) about to
        be stored, and those beginning at `reached`: a new one is appended; one already here
        must say what the leader's says (HistoryMismatch)."""
        history = self.history
        for entry in epochs:
            start = entry.start_offset
            if start > reached:
                break
            if entry.epoch > history.last_epoch:
                if history.starts and start < history.starts[-1]:
                    raise HistoryMismatch(
                        f"the leader's epoch {entry.epoch} begins at {start}, before this "
                        f"replica's epoch {history.last_epoch} at {history.starts[-1]}: "
                        "truncate to the agreed offset first"
                    )
                history = history.begin(entry.epoch, start)
                continue
            at = max(start, offset)
            if history.epoch_at(at) != entry.epoch:
                raise HistoryMismatch(
                    f"at {at} the leader's history says epoch {entry.epoch}, this replica's "
                    f"{history.epoch_at(at)}: truncate to the agreed offset first"
                )
        return history

    def _store(self, mf: MappedFile, data: bytes, checked: CheckedChunk) -> None:
        """Write a checked chunk at the end of `mf` and publish it, with the tables."""
        pos = mf.wrote_position
        mf.buf[pos : pos + len(data)] = data
        # The blank spans the rest of the segment, zeros already (segments are created so).
        mf.advance(mf.file_size - pos if checked.blank else len(data))
        for topic, queues in checked.queue_offsets.items():
            mine = self._queue_offsets.setdefault(topic, {})
            for queue_id, next_offset in queues.items():
                if mine.get(queue_id, 0) < next_offset:
                    mine[queue_id] = next_offset
        for producer_id, request in checked.requests:
            self._producers.apply(producer_id, request)
        self._newest_store_ts = -1  # found again from the newest record when asked

    def wait_durable(self, offset: int, timeout_s: float) -> int:
        """Wait until every byte below `offset` is flushed (or `timeout_s` passes, the store
        closes or a flush fails); returns the durable offset then."""
        deadline = time.monotonic() + timeout_s
        with self._durable:
            while (
                self.flushed_offset < offset
                and self._running
                and self._flush_failed is None
                and (self._flusher is None or self._flusher.failure is None)
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._durable.wait(remaining)
        return self.flushed_offset

    def _flushed(self, seconds: float) -> None:
        self._notify_durable()

    def _notify_durable(self) -> None:
        with self._durable:
            self._durable.notify_all()

    # -- truncation and a fresh start ----------------------------------------------------------

    def truncate(self, offset: int) -> int:
        """Cut the log back to `offset` (the agreed offset: a record boundary), durably and
        crash-safely (the module docstring's table): the bytes past it zeroed, later segments
        deleted, the checkpoint, queue and producer tables as of the cut, epochs that began
        at or past it dropped. A cut at or below the first segment's start leaves it empty
        there. Returns the new end (unchanged when `offset` is at or past it)."""
        with self._checkpoint_lock, self._put_lock:
            self._check_open()
            self._check_follower()
            self._check_writable()
            end = self.max_offset
            if offset >= end:
                # No byte to cut, but epochs that began at or past the agreed offset disagree
                # with the leader's (one a crash kept after the bytes were cut goes here).
                self._truncate_history(offset)
                return end
            assert self._flusher is not None
            self._flusher.flush_now()  # below the cut durable before the checkpoint says so
            offset = max(offset, self.min_offset)
            if not self.starts_record(offset):
                raise InvalidArgument(f"offset {offset} is not a record boundary", field="offset")
            try:
                self._cut(offset, end)
            except Exception as exc:
                # Part of the cut may be done: nothing more is written until a restart, whose
                # recovery finds the log at the cut or at the old end.
                self._flush_failed = exc
                raise
        self._notify_progress()
        self._notify_durable()
        log.warning("replica log cut at %d (was %d): %d bytes dropped", offset, end, end - offset)
        return offset

    def _cut(self, offset: int, end: int) -> None:
        """The truncation's steps, in the order that makes them crash-safe."""
        assert self._flusher is not None
        # The queue-offset table as it was when the log ended at `offset`.
        table = {topic: dict(queues) for topic, queues in self._queue_offsets.items()}
        lower_queue_offsets(self.queue, table, offset, end)
        entries = self._producers_at(offset)
        failpoints.hit("replica.truncate.before_checkpoint")
        self._write_checkpoint(offset, table_to_pairs(table), entries)
        failpoints.hit("replica.truncate.after_checkpoint")
        mf = self.queue.find_mapped_file_by_offset(offset)
        if mf is not None and offset - mf.file_from_offset < mf.wrote_position:
            mf.zero_from(offset - mf.file_from_offset)  # durable: flushed before it returns
            mf.truncate_to(offset - mf.file_from_offset)  # (so it is not zeroed twice)
        failpoints.hit("replica.truncate.after_zero")
        self.queue.truncate_dirty_files(offset)
        self._flusher.truncated(offset)
        failpoints.hit("replica.truncate.after_segments")
        self._truncate_history(offset)
        failpoints.hit("replica.truncate.after_history")
        self._queue_offsets = table
        self._producers.load(entries, end_offset=offset)
        self.appended.clear()
        self._newest_store_ts = -1
        self._corrupt_starts = {at: why for at, why in self._corrupt_starts.items() if at < offset}
        self._last_checkpoint_offset = offset

    def _truncate_history(self, offset: int) -> None:
        history = self.history.truncated(offset)
        if history != self.history:
            self._files.save_history(self.store_id, history)
            self.history = history

    def _producers_at(self, offset: int) -> list[ProducerEntry]:
        """The producer table as it was when the log ended at `offset`: a producer whose
        remembered requests all end by it keeps them; another gets back the newest requests it
        stored below it (as many as are remembered), found from their records' tags, newest
        segment first."""
        entries = self._producers.snapshot()
        window = self.config.producer_requests_max
        kept = [e for e in entries if all(r.end_offset <= offset for r in e.requests)]
        found: dict[str, list[ProducerRequest]] = {
            e.producer_id: [] for e in entries if e not in kept
        }
        for mf in reversed(self.queue.files):
            if not found or all(len(newest) >= window for newest in found.values()):
                break
            base = mf.file_from_offset
            if base >= offset or not mf.hold():
                continue
            try:
                hi = min(offset - base, mf.wrote_position)
                requests, _, _ = tagged_requests(mf.buf, 0, hi, base)
            finally:
                mf.release()
            for producer_id, request in reversed(requests):
                newest = found.get(producer_id)
                if newest is not None and len(newest) < window:
                    newest.append(request)
        rebuilt = [
            ProducerEntry(producer_id, newest[0].sequence, newest[::-1])
            for producer_id, newest in found.items()
            if newest
        ]
        return kept + rebuilt

    def start_at(self, start: LogStart) -> None:
        """Begin this replica's log at `start.offset` (the leader's first segment), holding
        nothing, with the leader's tables as of `start.taken_at`: for a follower that holds no
        byte (a new replica, or one whose whole log is behind the leader's first segment: cut
        it first). Crash-safe: a crash leaves it empty, here or where it was."""
        with self._checkpoint_lock, self._put_lock:
            self._check_open()
            self._check_follower()
            self._check_writable()
            low, end = self.min_offset, self.max_offset
            if end != low:
                raise FailedPrecondition(
                    f"this replica holds [{low}, {end}): it starts afresh only empty (truncate)"
                )
            if start.offset < 0 or start.offset % self.config.file_bytes:
                raise InvalidArgument(
                    f"a log starts at a segment's start, not {start.offset}", field="offset"
                )
            assert self._flusher is not None
            table = table_from_pairs(start.queue_offsets)
            # Each step leaves an empty log that recovery opens as such: no segment (then a
            # start at offset 0, or again here), or the first segment with the tables.
            self.history = LogHistory()  # it holds nothing: the leader's epochs come with bytes
            self._files.save_history(self.store_id, self.history)
            self.queue.destroy()
            failpoints.hit("replica.start.after_delete")
            self._write_checkpoint(start.offset, start.queue_offsets, start.producers)
            failpoints.hit("replica.start.after_checkpoint")
            self.queue.create_file(start.offset)
            self.queue.flushed_where = start.offset
            self._flusher.truncated(start.offset)
            self._queue_offsets = table
            self._producers.load(start.producers, end_offset=start.taken_at)
            self.appended.clear()
            self._newest_store_ts = -1
            self._corrupt_starts = {}
            self._last_checkpoint_offset = start.offset
        self._notify_durable()
        log.info("replica log begins afresh at %d", start.offset)
