"""Receipt handles: what Receive hands out and Ack / ChangeInvisibleDuration take back.

Opaque to clients; to us, one delivery of one queue offset to one group:

    0    1    9       13
    +----+----+-------+---------+
    | v  | qo | count | check   |   big-endian; v = 1
    +----+----+-------+---------+
    qo     queue offset (i64)          count  delivery count (i32, 1 on the first delivery)
    check  CRC32C over group NUL topic NUL queue id (decimal) NUL and the 13 bytes before it

sent as URL-safe base64 without padding (23 characters). The check binds a handle to the
(group, topic, queue) it was issued for: a handle presented for another queue, or mangled,
is refused as INVALID_ARGUMENT instead of acknowledging some other message. Nothing else
is secret or signed: a client that forges a valid handle can only ack what its group could.
"""

from __future__ import annotations

import base64
import binascii
import struct

import crc32c

from mqstore.errors import InvalidArgument

VERSION = 1
_BODY = struct.Struct(">Bqi")
_CHECK = struct.Struct(">I")
_RAW_BYTES = _BODY.size + _CHECK.size  # 17
_TEXT_CHARS = 23  # base64 of 17 bytes, unpadded


def _check(group: str, topic: str, queue_id: int, body: bytes) -> int:
    scope = f"{group}\0{topic}\0{queue_id}\0".encode()
    return int(crc32c.crc32c(scope + body))


def encode(group: str, topic: str, queue_id: int, queue_offset: int, delivery_count: int) -> str:
    body = _BODY.pack(VERSION, queue_offset, delivery_count)
    raw = body + _CHECK.pack(_check(group, topic, queue_id, body))
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode(
    handle: str, group: str, topic: str, queue_id: int, *, field: str = "receipt_handle"
) -> tuple[int, int]:
    """(queue offset, delivery count) of a handle issued for (group, topic, queue_id)."""
    if len(handle) != _TEXT_CHARS:
        raise InvalidArgument(f"malformed receipt handle {handle[:40]!r}", field=field)
    try:
        raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument(f"malformed receipt handle {handle!r}", field=field) from exc
    if len(raw) != _RAW_BYTES:
        raise InvalidArgument(f"malformed receipt handle {handle!r}", field=field)
    body = raw[: _BODY.size]
    version, queue_offset, count = _BODY.unpack(body)
    (check,) = _CHECK.unpack_from(raw, _BODY.size)
    if version != VERSION or check != _check(group, topic, queue_id, body):
        raise InvalidArgument(
            f"receipt handle {handle!r} was not issued for {group}/{topic}/{queue_id}",
            field=field,
        )
    if queue_offset < 0 or count < 1:
        raise InvalidArgument(f"malformed receipt handle {handle!r}", field=field)
    return queue_offset, count
