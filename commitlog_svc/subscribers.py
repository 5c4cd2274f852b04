"""The subscribers commitlog_svc has seen, their confirmed offsets, and the retention floor.

    {data_dir}/subscribers    CRC32C frame (mqstore.formats.commitlog_checkpoint): store id,
                              then (subscriber id, confirmed offset, updated at) per subscriber;
                              replaced atomically (write_atomic) before a change is answered

Every subscriber's confirmed offset is kept, connected or not: retention never deletes a
segment holding bytes at or above the lowest of them (CommitLog.set_floor_offset), and a
restart of the commit log keeps them. A subscription lowers its subscriber's offset to where
its stream starts (it needs everything from there); Confirm moves it to what the subscriber
reports. The file belongs to one store id: after the log was replaced the old offsets mean
nothing and are dropped (the subscribers rebuild from the new log's minimum anyway).

A subscriber that never comes back pins retention for good; `forget` drops one (an operator's
decision, not the store's).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

from mqstore.errors import CorruptFile, ResourceExhausted
from mqstore.formats.commitlog_checkpoint import (
    SubscriberOffset,
    decode_subscribers,
    encode_subscribers,
)
from mqstore.storage.clock import Clock
from mqstore.storage.disk import Disk, write_atomic

log = logging.getLogger(__name__)

SUBSCRIBERS_FILE = "subscribers"
# Subscribers remembered: each pins retention, so the table is small by nature; the bound keeps
# a client that invents ids from growing the file without limit.
SUBSCRIBERS_MAX = 1_024


@dataclass(slots=True)
class SubscriberState:
    subscriber_id: str
    confirmed_offset: int
    updated_at_ms: int = 0
    streams: int = 0  # open Subscribe calls
    position: int = -1  # where the newest open stream has sent up to (-1: none open)


class SubscriberRegistry:
    def __init__(self, disk: Disk, data_dir: str, store_id: bytes, clock: Clock) -> None:
        self._disk = disk
        self._path = os.path.join(data_dir, SUBSCRIBERS_FILE)
        self._store_id = store_id
        self._clock = clock
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._subs: dict[str, SubscriberState] = {}
        self._version = 0  # bumped on every change of a confirmed offset
        self._written = 0  # the version on disk

    # -- file ---------------------------------------------------------------------------------

    def load(self) -> None:
        if not self._disk.exists(self._path):
            return
        try:
            store_id, entries = decode_subscribers(self._disk.read(self._path), path=self._path)
        except CorruptFile as exc:
            # Losing these only lets retention delete more than a subscriber might still need:
            # say so loudly; the subscribers re-register on their next Subscribe.
            log.error("ignoring a corrupt subscriber table: %s", exc)
            return
        if store_id != self._store_id:
            log.warning("subscriber table belongs to another store id; starting empty")
            return
        with self._lock:
            for e in entries:
                self._subs[e.subscriber_id] = SubscriberState(
                    e.subscriber_id, e.confirmed_offset, e.updated_at_ms
                )
        log.info("subscribers: %d known, floor %s", len(entries), self.floor())

    def _persist(self) -> None:
        """Write the table if it changed; returns once it is durable."""
        with self._write_lock:
            with self._lock:
                version = self._version
                if version == self._written:
                    return
                entries = [
                    SubscriberOffset(s.subscriber_id, s.confirmed_offset, s.updated_at_ms)
                    for s in self._subs.values()
                ]
            write_atomic(self._disk, self._path, encode_subscribers(self._store_id, entries))
            with self._lock:
                self._written = max(self._written, version)

    # -- changes ------------------------------------------------------------------------------

    def _set(self, subscriber_id: str, offset: int) -> SubscriberState:
        """Under self._lock."""
        sub = self._subs.get(subscriber_id)
        if sub is None:
            if len(self._subs) >= SUBSCRIBERS_MAX:
                raise ResourceExhausted(
                    f"{SUBSCRIBERS_MAX} subscribers are known already; {subscriber_id!r} is not "
                    "taken (forget one first)"
                )
            sub = self._subs[subscriber_id] = SubscriberState(subscriber_id, offset)
            self._version += 1
        elif sub.confirmed_offset != offset:
            sub.confirmed_offset = offset
            self._version += 1
        sub.updated_at_ms = self._clock.now_ms()
        return sub

    def connect(self, subscriber_id: str, start_offset: int) -> None:
        """A Subscribe begins at `start_offset`: the subscriber needs everything from there."""
        with self._lock:
            sub = self._set(subscriber_id, start_offset)
            sub.streams += 1
            sub.position = start_offset
        self._persist()

    def disconnect(self, subscriber_id: str) -> None:
        with self._lock:
            sub = self._subs.get(subscriber_id)
            if sub is not None:
                sub.streams = max(0, sub.streams - 1)
                if sub.streams == 0:
                    sub.position = -1

    def advance(self, subscriber_id: str, position: int) -> None:
        """How far an open stream has sent (for dispatch-behind); not persisted."""
        with self._lock:
            sub = self._subs.get(subscriber_id)
            if sub is not None:
                sub.position = position

    def confirm(self, subscriber_id: str, offset: int) -> int:
        """Record a Confirm durably; returns the new floor."""
        with self._lock:
            self._set(subscriber_id, offset)
        self._persist()
        floor = self.floor()
        return offset if floor is None else floor

    def clamp(self, end_offset: int) -> int:
        """At start: a recovery may have cut the log below offsets subscribers confirmed; none
        of them holds anything of this log past its end, so their offsets come down to it
        (status and the floor say so at once, not only after each subscribes again). Returns
        how many moved."""
        with self._lock:
            moved = 0
            for sub in self._subs.values():
                if sub.confirmed_offset > end_offset:
                    sub.confirmed_offset = end_offset
                    moved += 1
            if moved:
                self._version += 1
        self._persist()
        return moved

    def forget(self, subscriber_id: str) -> bool:
        with self._lock:
            gone = self._subs.pop(subscriber_id, None) is not None
            if gone:
                self._version += 1
        self._persist()
        return gone

    # -- reading ------------------------------------------------------------------------------

    def floor(self) -> int | None:
        """The lowest confirmed offset of every known subscriber (None: there are none)."""
        with self._lock:
            return min((s.confirmed_offset for s in self._subs.values()), default=None)

    def snapshot(self) -> list[SubscriberState]:
        with self._lock:
            return [
                SubscriberState(
                    s.subscriber_id, s.confirmed_offset, s.updated_at_ms, s.streams, s.position
                )
                for s in sorted(self._subs.values(), key=lambda s: s.subscriber_id)
            ]

    def get(self, subscriber_id: str) -> SubscriberState | None:
        with self._lock:
            s = self._subs.get(subscriber_id)
            if s is None:
                return None
            return SubscriberState(
                s.subscriber_id, s.confirmed_offset, s.updated_at_ms, s.streams, s.position
            )

    def close(self) -> None:
        self._persist()
