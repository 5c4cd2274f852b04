"""Message ids, as RocketMQ builds them.

Offset msg id (MessageDecoder.createMessageId), uppercase hex:

    store IP (4 | 16) | store port (int32) | commit-log offset (int64)
    = 16 bytes, 32 hex chars for IPv4;  28 bytes, 56 hex chars for IPv6

Unique id, the UNIQ_KEY property (MessageClientIDSetter), uppercase hex:

    IP (4) | pid (int16) | instance hash (int32) | ms since month start (int32) | counter (int16)
    = 16 bytes, 32 hex chars; the first 20 hex chars are fixed per generator

RocketMQ takes the instance hash from a class loader and the month start in the JVM's local time
zone; mqstore draws the hash at random per generator and counts from the month start in UTC, so
the id does not depend on the host's time zone.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import secrets
import struct
import threading
import time
from collections.abc import Callable

from mqstore.errors import InvalidArgument
from mqstore.formats import _core

_OFFSET = struct.Struct(">q")

_HEX = re.compile(r"[0-9A-Fa-f]+")

OFFSET_MSG_ID_V4_CHARS = 32
OFFSET_MSG_ID_V6_CHARS = 56


def offset_msg_id(store_host: bytes, commit_log_offset: int) -> str:
    """The offset msg id of the record at `commit_log_offset`; `store_host` is packed ip+port."""
    return (store_host + _OFFSET.pack(commit_log_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[bytes, int]:
    """(packed store host, commit-log offset) of an offset msg id; InvalidArgument if malformed."""
    if len(msg_id) not in (OFFSET_MSG_ID_V4_CHARS, OFFSET_MSG_ID_V6_CHARS):
        raise InvalidArgument(
            f"offset msg id must be 32 (IPv4) or 56 (IPv6) hex chars, got {len(msg_id)}",
            field="msg_id",
        )
    if not _HEX.fullmatch(msg_id):
        raise InvalidArgument(f"offset msg id is not hex: {msg_id!r}", field="msg_id")
    raw = bytes.fromhex(msg_id)
    (offset,) = _OFFSET.unpack_from(raw, len(raw) - 8)
    if offset < 0:
        raise InvalidArgument("offset msg id carries a negative offset", field="msg_id")
    return raw[:-8], offset


def _month_start_ms(now_ms: int) -> int:
    now = dt.datetime.fromtimestamp(now_ms / 1000, tz=dt.UTC)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return int(start.timestamp() * 1000)


class UniqIdGenerator:
    """Unique ids for UNIQ_KEY. Thread-safe; `clock_ms` is injectable for tests."""

    def __init__(
        self,
        ip: bytes = b"\x7f\x00\x00\x01",
        *,
        clock_ms: Callable[[], int] | None = None,
        instance_hash: int | None = None,
    ) -> None:
        if len(ip) not in (4, 16):
            raise InvalidArgument("ip must be 4 or 16 bytes")
        if instance_hash is None:
            instance_hash = secrets.randbits(31)
        self._prefix = ip + struct.pack(">hi", os.getpid() & 0x7FFF, instance_hash)
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._counter = 0  # the next id's, taken under the lock
        self._lock = threading.Lock()
        # (start, end) of the current month in ms, replaced as one tuple: read without the lock.
        self._month: tuple[int, int] = (-1, -1)
        self._prefix_hex = self._prefix.hex().upper()

    def next_id(self) -> str:
        return self.next_ids(1)[0]

    def next_ids(self, n: int) -> list[str]:
        """`n` ids at once, one clock read: the same as n single ids made within one ms,
        `prefix + pack(">IH", ms into the month, counter)` as uppercase hex each."""
        diff = self._ms_into_month()
        with self._lock:  # no other thread takes a counter in between
            first = self._counter
            self._counter = first + n
        return _core.uniq_ids(f"{self._prefix_hex}{diff & 0xFFFFFFFF:08X}", first, n)

    def _ms_into_month(self) -> int:
        """Milliseconds since the start of the current month (UTC), the id's time field."""
        now_ms = self._clock_ms()
        start, end = self._month
        if not start <= now_ms < end:
            with self._lock:
                start, end = self._month
                if not start <= now_ms < end:
                    start, end = self._month = _month_of(now_ms)
        return now_ms - start


def _month_of(now_ms: int) -> tuple[int, int]:
    """The start and end (ms, UTC) of the month holding `now_ms`."""
    start = _month_start_ms(now_ms)
    start_dt = dt.datetime.fromtimestamp(start / 1000, tz=dt.UTC)
    if start_dt.month == 12:
        nxt = start_dt.replace(year=start_dt.year + 1, month=1)
    else:
        nxt = start_dt.replace(month=start_dt.month + 1)
    return start, int(nxt.timestamp() * 1000)
