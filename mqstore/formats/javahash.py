"""Java's `String.hashCode()`, which RocketMQ's formats depend on.

    h = 31 * h + c   over the UTF-16 code units of the string, in int32 arithmetic

Used for a consume-queue unit's tagsCode (the hash of the whole TAGS string) and for the index
file's key hash. Python's `hash()` is salted per process and must never stand in for it.
"""

from __future__ import annotations

import struct
from functools import lru_cache

_U32 = 0xFFFFFFFF
_INT32_MIN = -(1 << 31)


def java_string_hash(s: str) -> int:
    """`s.hashCode()` as a signed int32, exactly as the JVM computes it."""
    if s.isascii():
        units: bytes | tuple[int, ...] = s.encode("ascii")
    else:
        encoded = s.encode("utf-16-be", "surrogatepass")
        units = struct.unpack(f">{len(encoded) // 2}H", encoded)
    h = 0
    for unit in units:
        h = (31 * h + unit) & _U32
    return h - (1 << 32) if h & 0x80000000 else h


# Tags repeat across messages (a topic has a handful), so the dispatch path asks the cache.
_TAGS_CACHE_ENTRIES = 4096


@lru_cache(maxsize=_TAGS_CACHE_ENTRIES)
def tags_code(tags: str | None) -> int:
    """A consume-queue unit's tagsCode: hashCode of the TAGS string, 0 when there are none."""
    if not tags:
        return 0
    return java_string_hash(tags)


def index_key_hash(key: str) -> int:
    """RocketMQ's `indexKeyHashMethod`: abs(hashCode), with Integer.MIN_VALUE mapped to 0."""
    h = java_string_hash(key)
    if h == _INT32_MIN:
        return 0
    return abs(h)
