"""Which index shard owns a key: the one function the index engine and every client share.

A message key is indexed (and looked up) as the string `topic + "#" + key`, exactly the string
RocketMQ's index hashes (rocketmq-store.md §4.3). Its shard is decided in two documented steps,
so that a client in any language computes the same answer:

1. `key_hash64`: BLAKE2b (RFC 7693) with an 8-byte digest (the digest-size parameter is 8; this
   is not the first 8 bytes of BLAKE2b-512), no key, over the UTF-8 bytes of `topic#key`, read
   as a big-endian unsigned 64-bit integer. Python's `hash()` is salted per process and must
   never stand in for it.
2. `shard_of_hash`: Jump Consistent Hash (Lamping and Veach, 2014, arXiv:1406.2294) of that
   integer into `shard_count` buckets, with the paper's 64-bit LCG and IEEE-754 double division.

Why jump hashing rather than `hash % shard_count`: when the shard count grows from n to m, a key
either keeps its shard or moves to one of the new shards n..m-1. The existing shards therefore
still hold every key they own after the growth, and only the new shards are built from the log.
(When the count shrinks, keys move into the surviving shards, which must then be rebuilt.)

The same 64-bit hash is what the index engine's exact mode stores beside each entry.
Pure functions: no I/O, no state.
"""

from __future__ import annotations

import hashlib

from mqstore.errors import InvalidArgument

KEY_SEPARATOR = "#"
HASH64_DIGEST_BYTES = 8
_U64 = (1 << 64) - 1
# The LCG of the jump consistent hash paper (Knuth's MMIX multiplier).
JUMP_MULTIPLIER = 2862933555777941757
_JUMP_SCALE = float(1 << 31)


def index_key(topic: str, key: str) -> str:
    """The string an index hashes for `key` of `topic` (also for a unique id)."""
    return topic + KEY_SEPARATOR + key


def key_hash64(indexed_key: str) -> int:
    """BLAKE2b-64 of the UTF-8 bytes of an index key, as an unsigned 64-bit integer."""
    digest = hashlib.blake2b(
        indexed_key.encode("utf-8", "surrogatepass"), digest_size=HASH64_DIGEST_BYTES
    ).digest()
    return int.from_bytes(digest, "big")


def check_shard_count(shard_count: int) -> None:
    if shard_count < 1:
        raise InvalidArgument(f"shard_count must be at least 1, got {shard_count}")


def shard_of_hash(hash64: int, shard_count: int) -> int:
    """Jump consistent hash of a 64-bit key into [0, shard_count)."""
    check_shard_count(shard_count)
    key = hash64 & _U64
    bucket = -1
    candidate = 0
    while candidate < shard_count:
        bucket = candidate
        key = (key * JUMP_MULTIPLIER + 1) & _U64
        candidate = int((bucket + 1) * (_JUMP_SCALE / float((key >> 33) + 1)))
    return bucket


def shard_of(topic: str, key: str, shard_count: int) -> int:
    """The shard in [0, shard_count) that indexes `key` (or unique id) of `topic`."""
    check_shard_count(shard_count)
    if shard_count == 1:
        return 0
    return shard_of_hash(key_hash64(index_key(topic, key)), shard_count)
