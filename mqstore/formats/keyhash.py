"""Key hashes for a whole dispatch batch at once.

The index needs, per key, RocketMQ's 32-bit hash (Java `String.hashCode`, which in pure Python
costs a loop step per character: ~2.4 us for a 20-character key) and, in exact or sharded mode,
the 64-bit hash and the shard of mqstore.sharding. index_svc hashes a dispatch frame's keys in
the compiled core straight from the frame's UTF-8 columns, one C loop per key, no str made
(`message_key_hashes`); str keys (`java_hashes`, `index_hashes`) and keys held as Arrow UTF-8
columns (`java_hashes_utf8`, the Spark jobs) likewise, one C loop per key over its UTF-16 code
units (from the UTF-8 bytes for a column):

    hashCode(s) = sum(s[i] * 31**(len - 1 - i)) mod 2**32     (UTF-16 code units)

The jump consistent hash is likewise run for the batch, one numpy step per jump, with
the same double arithmetic as the scalar function. Tests check both against the scalar
definitions (mqstore.formats.javahash, mqstore.sharding) for many keys.

Used by index_svc's engine and by the Spark rebuild and audit jobs, which also share the
key format (`message_keys`): "topic#UNIQ_KEY", then "topic#token" for each KEYS token.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from mqstore.formats import _core
from mqstore.formats.javahash import index_key_hash
from mqstore.sharding import HASH64_DIGEST_BYTES, JUMP_MULTIPLIER

_INT32_MIN = -(1 << 31)


# Between a message's topic and each of its keys in an index key (RocketMQ's buildKey).
KEY_TOPIC_SEPARATOR = "#"


def message_keys(topic: str, uniq_key: str, keys: str) -> list[str]:
    """The index keys of one message, in the order they are written."""
    prefix = topic + KEY_TOPIC_SEPARATOR
    out = [prefix + uniq_key] if uniq_key else []
    if keys:
        out.extend(prefix + token for token in keys.split(" ") if token)
    return out


def java_hashes(keys: Sequence[str]) -> np.ndarray:
    """Java `String.hashCode()` of every key, as int64 holding the signed int32 values (the
    compiled core, key by key; javahash.java_string_hash is the specification)."""
    return np.frombuffer(_core.java_hashes(list(keys)), dtype=np.int64)


def index_hashes(keys: Sequence[str]) -> np.ndarray:
    """RocketMQ's indexKeyHashMethod for every key: abs(hashCode), Integer.MIN_VALUE -> 0."""
    return _index_of_java(java_hashes(keys))


def message_key_hashes(
    topics: Sequence[str],
    topic_indexes: np.ndarray,
    rows: np.ndarray,
    uniq: tuple[bytes, np.ndarray],
    keys: tuple[bytes, np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """The index hashes of the keys of a dispatch frame's `rows` (message_keys of each row, in
    order), and the row of each key. `uniq` and `keys` are string columns as the frame carries
    them (UTF-8 bytes, int64 offsets: 0 and each end, or none): the keys are hashed from their
    bytes in the compiled core (_core.index_message_keys), no str made. Its specification is
    message_key_hashes_reference, which the tests pin it to."""
    hashes, key_rows = _core.index_message_keys(
        [topic + KEY_TOPIC_SEPARATOR for topic in topics],
        np.ascontiguousarray(topic_indexes, dtype=np.int64),
        np.ascontiguousarray(rows, dtype=np.int64),
        uniq[0],
        np.ascontiguousarray(uniq[1], dtype=np.int64),
        keys[0],
        np.ascontiguousarray(keys[1], dtype=np.int64),
    )
    return np.frombuffer(hashes, dtype=np.int64), np.frombuffer(key_rows, dtype=np.int64)


def message_key_hashes_reference(
    topics: Sequence[str],
    topic_indexes: Sequence[int],
    rows: Sequence[int],
    uniq: Sequence[str],
    keys: Sequence[str],
) -> tuple[list[int], list[int]]:
    """message_key_hashes over str columns (empty: no strings), one key at a time: RocketMQ's
    buildIndex (message_keys) and indexKeyHashMethod (javahash.index_key_hash)."""
    hashes: list[int] = []
    key_rows: list[int] = []
    for r in rows:
        for key in message_keys(
            topics[topic_indexes[r]], uniq[r] if uniq else "", keys[r] if keys else ""
        ):
            hashes.append(index_key_hash(key))
            key_rows.append(r)
    return hashes, key_rows


def _index_of_java(h: np.ndarray) -> np.ndarray:
    return np.where(h == _INT32_MIN, 0, np.abs(h))


def hashes64(keys: Sequence[str]) -> np.ndarray:
    """mqstore.sharding.key_hash64 of every key, as uint64."""
    blake2b = hashlib.blake2b
    digests = b"".join(
        [
            blake2b(k.encode("utf-8", "surrogatepass"), digest_size=HASH64_DIGEST_BYTES).digest()
            for k in keys
        ]
    )
    return np.frombuffer(digests, dtype=">u8").astype(np.uint64)


def jump_shards(hashes: np.ndarray, shard_count: int) -> np.ndarray:
    """mqstore.sharding.shard_of_hash of every uint64 hash, as int64."""
    m = len(hashes)
    bucket = np.full(m, -1, dtype=np.int64)
    if shard_count == 1:
        bucket[:] = 0
        return bucket
    key = hashes.astype(np.uint64, copy=True)
    candidate = np.zeros(m, dtype=np.int64)
    active = np.arange(m)
    multiplier = np.uint64(JUMP_MULTIPLIER)
    scale = float(1 << 31)
    while len(active):
        bucket[active] = candidate[active]
        k = key[active] * multiplier + np.uint64(1)
        key[active] = k
        quotient = scale / ((k >> np.uint64(33)) + np.uint64(1)).astype(np.float64)
        candidate[active] = ((bucket[active] + 1).astype(np.float64) * quotient).astype(np.int64)
        active = active[candidate[active] < shard_count]
    return bucket


def java_hashes_utf8(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """java_hashes of the keys whose UTF-8 bytes are data[offsets[i]:offsets[i + 1]] (the
    buffers of an Arrow string column), hashed from the bytes: no str made."""
    return np.frombuffer(
        _core.java_hashes_utf8(
            np.ascontiguousarray(data, dtype=np.uint8),
            np.ascontiguousarray(offsets, dtype=np.int64),
        ),
        dtype=np.int64,
    )


def index_hashes_utf8(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """index_hashes of keys held as java_hashes_utf8 takes them."""
    return _index_of_java(java_hashes_utf8(data, offsets))
