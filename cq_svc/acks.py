"""Receive / ack / change-invisible-duration per message, kept as RabbitMQ's queue index keeps
it (reference/rabbitmq-queue-index.md): a journal per (group, topic, queue), folded into
segment files (ack_journal.py, ack_segment.py).

State machine of one queue offset, for one group:

    never delivered ──receive──▶ DELIVERED(count=1, deadline=now+invisible)
    DELIVERED(c, d) ──now >= d, receive──▶ DELIVERED(c+1, now+invisible)     redelivery
    DELIVERED(c, d) ──change(c, ms)──▶ DELIVERED(c, now+ms)
    DELIVERED(c, _) ──ack(c)──▶ ACKED                                         terminal
    below the committed offset: forgotten (all acked, or skipped because it expired)

A receipt is (queue offset, delivery count): an ack or change naming an older delivery than
the current one is refused (ReceiptExpired), so a slow consumer cannot ack a message that was
handed to someone else. An ack of an offset already acked succeeds again (idempotent).

The committed offset is the lowest offset not acked. Memory per (group, queue) holds the offsets
between it and the newest delivered (bounded by `ack_window_max`) and a deadline heap.

Durability: every change is journaled before the call returns; under `ack_flush: sync` the
journal is fsynced first, so an acknowledged ack survives a crash and is never redelivered.
Fold (journal past `ack_journal_entries_max` entries, the queue idle, or eviction): rewrite the
touched segments, write meta, delete segments wholly below the committed offset, truncate the
journal, in that order, so a crash at any step loses nothing (replay is monotonic).
"""

from __future__ import annotations

import heapq
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

from cq_svc.ack_journal import JournalEntry, Kind, decode_entries, encode_entries
from cq_svc.ack_segment import (
    ACKED,
    DELIVERED,
    Slots,
    decode_meta,
    decode_segment,
    encode_meta,
    encode_segment,
    segment_name,
    segment_number,
)
from cq_svc.config import AckFlush, CqConfig
from cq_svc.errors import ReceiptExpired
from mqstore.errors import CorruptFile, InvalidArgument
from mqstore.limits import TOPIC_PATTERN
from mqstore.storage import failpoints
from mqstore.storage.clock import Clock
from mqstore.storage.disk import AppendFile, Disk, write_atomic

log = logging.getLogger(__name__)

AckKey = tuple[str, str, int]  # group, topic, queue id
# Ack queues with state in memory (and an open journal: one fd each) at once.
OPEN_ACK_QUEUES_MAX = 1024


@dataclass(frozen=True, slots=True)
class Delivery:
    queue_offset: int
    delivery_count: int
    deadline_ms: int


class AckQueue:
    """The delivery state of one group in one queue (pure in-memory logic + its journal)."""

    def __init__(self, disk: Disk, path: str, config: CqConfig) -> None:
        self._disk = disk
        self.path = path
        self._config = config
        self.floor = -1  # committed offset; -1 until the first receive places it
        self.high = -1  # next offset never delivered
        self.slots: Slots = {}
        self._heap: list[tuple[int, int, int]] = []  # (deadline, offset, count)
        self._journal: AppendFile | None = None
        self.journal_entries = 0
        self._dirty_segments: set[int] = set()
        self.last_used_ms = 0.0

    # -- load / fold ----------------------------------------------------------------------------

    def _p(self, name: str) -> str:
        return os.path.join(self.path, name)

    def load(self) -> None:
        disk = self._disk
        disk.makedirs(self.path)
        seg_n = self._config.ack_segment_entries
        meta = self._p("meta")
        if disk.exists(meta):
            self.floor = decode_meta(disk.read(meta), path=meta)
            self.high = self.floor
        for name in disk.listdir(self.path):
            n = segment_number(name)
            if n is None:
                continue
            if self.floor >= 0 and (n + 1) * seg_n <= self.floor:
                disk.remove(self._p(name))  # left by a crash inside a fold
                continue
            try:
                self.slots.update(decode_segment(disk.read(self._p(name)), seg_n, path=name))
            except CorruptFile as exc:
                # Written whole with write_atomic: damage here is media corruption. Losing the
                # segment would redeliver acked messages; refuse to guess.
                raise CorruptFile(self._p(name), f"ack segment unreadable: {exc.reason}") from exc
        jpath = self._p("journal")
        if disk.exists(jpath):
            data = disk.read(jpath)
            entries, good, bad = decode_entries(data)
            if bad:
                log.error("%s: %d corrupt journal entries skipped", jpath, bad)
            if good < len(data):
                log.warning("%s: torn journal tail of %d bytes dropped", jpath, len(data) - good)
                disk.truncate(jpath, good)
            for e in entries:
                self._apply(e)
            self.journal_entries = len(entries)
            self._dirty_segments.update(o // seg_n for o in self.slots)
        if self.slots:
            self.high = max(self.high, max(self.slots) + 1)
            if self.floor < 0:
                self.floor = min(self.slots)
        self._advance_floor()
        for off, (state, count, deadline) in self.slots.items():
            if state == DELIVERED:
                heapq.heappush(self._heap, (deadline, off, count))
        self._journal = disk.open_append(jpath)
        disk.fsync_dir(self.path)

    def fold(self) -> None:
        """Journal into segments (module docstring for the order)."""
        if self.journal_entries == 0 and not self._dirty_segments:
            return
        disk = self._disk
        seg_n = self._config.ack_segment_entries
        live = {s for s in self._dirty_segments if (s + 1) * seg_n > self.floor}
        for s in sorted(live):
            write_atomic(disk, self._p(segment_name(s)), encode_segment(s, seg_n, self.slots))
        failpoints.hit("cq.ack.fold.after_segments")
        write_atomic(disk, self._p("meta"), encode_meta(max(self.floor, 0)))
        failpoints.hit("cq.ack.fold.after_meta")
        for name in disk.listdir(self.path):
            n = segment_number(name)
            if n is not None and (n + 1) * seg_n <= self.floor:
                disk.remove(self._p(name))
        disk.fsync_dir(self.path)
        if self._journal is not None:
            self._journal.close()
        disk.truncate(self._p("journal"), 0)
        self._journal = disk.open_append(self._p("journal"))
        self.journal_entries = 0
        self._dirty_segments.clear()

    def close(self) -> None:
        self.fold()
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    # -- journal --------------------------------------------------------------------------------

    def _write(self, entries: list[JournalEntry], *, sync: bool) -> None:
        if not entries:
            return
        assert self._journal is not None
        self._journal.append(encode_entries(entries))
        failpoints.hit("cq.ack.after_append")
        if sync:
            self._journal.sync()
        seg_n = self._config.ack_segment_entries
        self._dirty_segments.update(e.queue_offset // seg_n for e in entries)
        self.journal_entries += len(entries)
        if self.journal_entries > self._config.ack_journal_entries_max:
            self.fold()

    def sync(self) -> None:
        if self._journal is not None:
            self._journal.sync()

    def _apply(self, e: JournalEntry) -> None:
        """Replay one entry, monotonically (ack wins, counts never go back)."""
        off = e.queue_offset
        if e.kind is Kind.SKIP:
            self._skip_to(off)
            return
        if self.floor >= 0 and off < self.floor:
            return
        cur = self.slots.get(off)
        if e.kind is Kind.ACK:
            count = cur[1] if cur is not None else e.delivery_count
            self.slots[off] = (ACKED, max(count, e.delivery_count), 0)
        elif e.kind is Kind.DELIVER:
            if cur is None or (cur[0] == DELIVERED and e.delivery_count >= cur[1]):
                self.slots[off] = (DELIVERED, e.delivery_count, e.deadline_ms)
        elif cur is not None and cur[0] == DELIVERED and cur[1] == e.delivery_count:
            self.slots[off] = (DELIVERED, cur[1], e.deadline_ms)
        self.high = max(self.high, off + 1)

    def _skip_to(self, offset: int) -> None:
        if offset <= self.floor:
            return
        self.floor = offset
        self.high = max(self.high, offset)
        for off in [o for o in self.slots if o < offset]:
            del self.slots[off]

    def _advance_floor(self) -> None:
        if self.floor < 0:
            return
        slots = self.slots
        while True:
            cur = slots.get(self.floor)
            if cur is None or cur[0] != ACKED:
                break
            del slots[self.floor]
            self.floor += 1

    # -- operations -----------------------------------------------------------------------------

    def place(self, start: int) -> None:
        """Where a group new to this queue starts (its committed offset or the queue's min)."""
        if self.floor < 0:
            self.floor = self.high = start
            self._write([JournalEntry(Kind.SKIP, start)], sync=False)

    def receive(
        self, max_count: int, invisible_ms: int, now_ms: int, queue_min: int, queue_max: int
    ) -> list[Delivery]:
        if self.floor < queue_min:
            self._skip_to(queue_min)
            self._write([JournalEntry(Kind.SKIP, queue_min)], sync=False)
        out: list[Delivery] = []
        deadline = now_ms + invisible_ms
        heap = self._heap
        while heap and len(out) < max_count and heap[0][0] <= now_ms:
            _, off, count = heapq.heappop(heap)
            cur = self.slots.get(off)
            if cur is None or cur[0] != DELIVERED or cur[1] != count or cur[2] > now_ms:
                continue  # stale heap entry (acked, changed, or redelivered since)
            out.append(Delivery(off, count + 1, deadline))
            # Now, not after the loop: a second heap entry of this delivery (left by a
            # change) must find it redelivered already.
            self.slots[off] = (DELIVERED, count + 1, deadline)
        window_end = self.floor + self._config.ack_window_max
        while len(out) < max_count and self.high < min(queue_max, window_end):
            out.append(Delivery(self.high, 1, deadline))
            self.high += 1
        for d in out:
            self.slots[d.queue_offset] = (DELIVERED, d.delivery_count, d.deadline_ms)
            heapq.heappush(heap, (d.deadline_ms, d.queue_offset, d.delivery_count))
        self._write(
            [
                JournalEntry(Kind.DELIVER, d.queue_offset, d.delivery_count, d.deadline_ms)
                for d in out
            ],
            sync=False,
        )
        return out

    def _current(self, offset: int, count: int, who: AckKey) -> tuple[int, int, int] | None:
        """The slot a receipt names; None when it is already acked; raises when stale."""
        if offset < self.floor:
            return None
        cur = self.slots.get(offset)
        if cur is None:
            raise ReceiptExpired(*who, offset, "never delivered")
        if cur[0] == ACKED:
            return None
        if cur[1] != count:
            raise ReceiptExpired(*who, offset, f"delivery {count}, current is {cur[1]}")
        return cur

    def ack(
        self, receipts: list[tuple[int, int]], who: AckKey, *, sync: bool
    ) -> list[tuple[int, int]]:
        """Acknowledge the current receipts among `receipts`; returns the stale ones (not
        acked). Checked one by one before anything changes, so a stale receipt in a batch
        never leaves the others acked in memory but not in the journal."""
        entries = []
        stale = []
        for offset, count in receipts:
            try:
                if self._current(offset, count, who) is None:
                    continue
            except ReceiptExpired:
                stale.append((offset, count))
                continue
            self.slots[offset] = (ACKED, count, 0)
            entries.append(JournalEntry(Kind.ACK, offset, count))
        self._advance_floor()  # before the write: a fold inside it must see the new floor
        self._write(entries, sync=sync)
        return stale

    def next_deadline_ms(self) -> int | None:
        """The earliest deadline of a message still delivered and unacked (when it becomes
        receivable again), dropping stale heap entries on the way; None without any."""
        heap = self._heap
        while heap:
            deadline, off, count = heap[0]
            cur = self.slots.get(off)
            if cur is not None and cur[0] == DELIVERED and cur[1] == count and cur[2] == deadline:
                return deadline
            heapq.heappop(heap)
        return None

    def change_invisible(
        self, offset: int, count: int, invisible_ms: int, now_ms: int, who: AckKey, *, sync: bool
    ) -> Delivery:
        cur = self._current(offset, count, who)
        if cur is None:
            raise ReceiptExpired(*who, offset, "already acknowledged")
        deadline = now_ms + invisible_ms
        self.slots[offset] = (DELIVERED, count, deadline)
        heapq.heappush(self._heap, (deadline, offset, count))
        self._write([JournalEntry(Kind.CHANGE, offset, count, deadline)], sync=sync)
        return Delivery(offset, count, deadline)

    def reset_to(self, offset: int) -> None:
        """A group's offset moved by an admin: everything below is settled, above is new."""
        self.slots = {o: s for o, s in self.slots.items() if o >= offset}
        self.floor = offset
        self.high = max(offset, max(self.slots) + 1 if self.slots else offset)
        self._write([JournalEntry(Kind.SKIP, offset)], sync=True)


class AckManager:
    """Every (group, topic, queue) ack state under groups/acks/, an LRU of open ones."""

    def __init__(self, disk: Disk, root: str, config: CqConfig, clock: Clock) -> None:
        self._disk = disk
        self._root = root
        self._config = config
        self._clock = clock
        self._sync = config.ack_flush is AckFlush.SYNC
        self._open: OrderedDict[AckKey, AckQueue] = OrderedDict()
        self._lock = threading.Lock()

    def _path(self, key: AckKey) -> str:
        group, topic, qid = key
        if not TOPIC_PATTERN.match(group) or not TOPIC_PATTERN.match(topic) or qid < 0:
            raise InvalidArgument(f"bad group/topic/queue {group!r}/{topic!r}/{qid}", field="group")
        return os.path.join(self._root, group, topic, str(qid))

    def _queue(self, key: AckKey) -> AckQueue:
        q = self._open.get(key)
        if q is None:
            q = AckQueue(self._disk, self._path(key), self._config)
            q.load()
            self._open[key] = q
            while len(self._open) > OPEN_ACK_QUEUES_MAX:
                _, old = self._open.popitem(last=False)
                old.close()
        else:
            self._open.move_to_end(key)
        q.last_used_ms = self._clock.monotonic_ms()
        return q

    def has_state(self, key: AckKey) -> bool:
        with self._lock:
            return (
                key in self._open
                or self._disk.exists(os.path.join(self._path(key), "meta"))
                or self._disk.exists(os.path.join(self._path(key), "journal"))
            )

    def committed_offset(self, key: AckKey) -> int:
        with self._lock:
            return self._queue(key).floor

    def keys(self) -> list[AckKey]:
        """Every (group, topic, queue) with ack state: open, or on disk as
        groups/acks/GROUP/TOPIC/QUEUE/. Names that are not a group, topic and queue id are
        skipped (nothing this manager wrote)."""
        with self._lock:
            found = set(self._open)
            for group in self._listdirs(self._root):
                for topic in self._listdirs(os.path.join(self._root, group)):
                    for qid in self._listdirs(os.path.join(self._root, group, topic)):
                        if (
                            qid.isdigit()
                            and TOPIC_PATTERN.match(group)
                            and TOPIC_PATTERN.match(topic)
                        ):
                            found.add((group, topic, int(qid)))
        return sorted(found)

    def _listdirs(self, path: str) -> list[str]:
        if not self._disk.isdir(path):
            return []
        return [n for n in self._disk.listdir(path) if self._disk.isdir(os.path.join(path, n))]

    def receive(
        self,
        key: AckKey,
        *,
        start_offset: int,
        max_count: int,
        invisible_ms: int,
        queue_min: int,
        queue_max: int,
    ) -> list[Delivery]:
        if max_count <= 0 or invisible_ms <= 0:
            raise InvalidArgument("max_count and invisible_ms must be positive")
        with self._lock:
            q = self._queue(key)
            q.place(max(start_offset, queue_min))
            out = q.receive(max_count, invisible_ms, self._clock.now_ms(), queue_min, queue_max)
            if self._sync and out:
                q.sync()
            return out

    def ack(
        self, key: AckKey, receipts: list[tuple[int, int]]
    ) -> tuple[int, list[tuple[int, int]]]:
        """Acknowledge (offset, delivery count) receipts; returns the committed offset after,
        and the receipts that were stale (not acked)."""
        with self._lock:
            q = self._queue(key)
            stale = q.ack(receipts, key, sync=self._sync)
            return q.floor, stale

    def next_deadline_ms(self, key: AckKey) -> int | None:
        """Wall-clock ms at which a delivered message of `key` becomes receivable again."""
        with self._lock:
            return self._queue(key).next_deadline_ms()

    def change_invisible(
        self, key: AckKey, offset: int, delivery_count: int, invisible_ms: int
    ) -> Delivery:
        with self._lock:
            q = self._queue(key)
            return q.change_invisible(
                offset, delivery_count, invisible_ms, self._clock.now_ms(), key, sync=self._sync
            )

    def reset(self, key: AckKey, offset: int) -> None:
        with self._lock:
            self._queue(key).reset_to(offset)

    def sync_all(self) -> None:
        with self._lock:
            for q in self._open.values():
                q.sync()

    def fold_idle(self) -> int:
        """Fold and drop queues idle past `ack_idle_ms`; returns how many."""
        now = self._clock.monotonic_ms()
        dropped = 0
        with self._lock:
            for key, q in list(self._open.items()):
                if now - q.last_used_ms >= self._config.ack_idle_ms:
                    q.close()
                    del self._open[key]
                    dropped += 1
        return dropped

    def close(self) -> None:
        with self._lock:
            for q in self._open.values():
                q.close()
            self._open.clear()
