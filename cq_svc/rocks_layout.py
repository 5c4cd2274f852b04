"""RocksDB consume-queue key/value layouts, RocketMQ's (§8), as pure functions.

Column family `default`, one row per unit:

    key   (19 + topicLen bytes)
    0      4         5       5+n   6+n       10+n  11+n            19+n
    +------+---------+-------+-----+---------+-----+---------------+
    | n    | 0x01    | topic | 0x01| queueId | 0x01| queue offset  |   big-endian
    +------+---------+-------+-----+---------+-----+---------------+
      int32            UTF-8        int32            int64

    value (28 bytes)
    0        8        12                20                28
    +--------+--------+-----------------+-----------------+
    | phy    | size   | tags_code       | store time ms   |
    +--------+--------+-----------------+-----------------+

The store time is the indexed (running maximum) time of time_file.py, so time lookups read only
these rows and behave as on the file store.

Column family `offset`, two rows per queue and the checkpoint row:

    key   (14 + topicLen bytes): n | 0x01 | topic | 0x01 | "max" or "min" | 0x01 | queueId
    value (16 bytes): int64 phy | int64 queue offset
        max: the last written unit (offset and its phy); the queue's max offset is this + 1
        min: the queue's first valid unit

    checkpoint row: topic "CHECKPOINT_TOPIC", "max", queueId 0; value int64: the end of the
    newest entry applied, written in the same WriteBatch as the units it covers.

Non-negative big-endian integers sort as numbers, so a queue's units are contiguous and ordered.
"""

from __future__ import annotations

import struct

UNIT_VALUE = struct.Struct(">qiqq")
assert UNIT_VALUE.size == 28
OFFSET_VALUE = struct.Struct(">qq")
CHECKPOINT_VALUE = struct.Struct(">q")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
CTRL_1 = b"\x01"
MAX = b"max"
MIN = b"min"
CHECKPOINT_TOPIC = "CHECKPOINT_TOPIC"  # TopicValidator.RMQ_SYS_ROCKSDB_OFFSET_TOPIC


def queue_prefix(topic: str, queue_id: int) -> bytes:
    """Every unit key of the queue starts with this (19 + n - 8 bytes)."""
    t = topic.encode()
    return _I32.pack(len(t)) + CTRL_1 + t + CTRL_1 + _I32.pack(queue_id) + CTRL_1


def unit_key(prefix: bytes, queue_offset: int) -> bytes:
    return prefix + _I64.pack(queue_offset)


def decode_unit_key(key: bytes) -> tuple[str, int, int]:
    (n,) = _I32.unpack_from(key, 0)
    topic = key[5 : 5 + n].decode()
    (qid,) = _I32.unpack_from(key, 6 + n)
    (offset,) = _I64.unpack_from(key, 11 + n)
    return topic, qid, offset


def offset_key(topic: str, kind: bytes, queue_id: int) -> bytes:
    t = topic.encode()
    return _I32.pack(len(t)) + CTRL_1 + t + CTRL_1 + kind + CTRL_1 + _I32.pack(queue_id)


def decode_offset_key(key: bytes) -> tuple[str, bytes, int]:
    (n,) = _I32.unpack_from(key, 0)
    topic = key[5 : 5 + n].decode()
    kind = key[6 + n : 9 + n]
    (qid,) = _I32.unpack_from(key, 10 + n)
    return topic, kind, qid


CHECKPOINT_KEY = offset_key(CHECKPOINT_TOPIC, MAX, 0)
