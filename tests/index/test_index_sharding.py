"""mqstore.sharding (the function clients and the engine share) and the engine's batch hashes,
which must agree with the scalar definitions key for key."""

from __future__ import annotations

import hashlib
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.errors import InvalidArgument
from mqstore.formats import keyhash
from mqstore.formats.javahash import index_key_hash, java_string_hash
from mqstore.sharding import index_key, key_hash64, shard_of, shard_of_hash


@pytest.mark.parametrize(
    ("key", "buckets", "expected"),
    # Published vectors of the paper's algorithm (python-jump-consistent-hash's tests).
    [(1, 1, 0), (42, 57, 43), (0xDEAD10CC, 1, 0), (0xDEAD10CC, 666, 361), (256, 1024, 520)],
)
def test_jump_hash_matches_the_published_vectors(key: int, buckets: int, expected: int) -> None:
    assert shard_of_hash(key, buckets) == expected


def test_hash64_is_blake2b_with_an_8_byte_digest_of_the_utf8_key_big_endian() -> None:
    for key in ["T#Aa", "T#BB", "Topic#ünïcode", "T#"]:
        digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
        assert key_hash64(key) == int.from_bytes(digest, "big")
    # Pinned: a change of digest size, encoding or byte order would move every key's shard.
    assert key_hash64("T#Aa") == 0x62824A4274A7CABE
    assert key_hash64("TopicTest#order-1") == 0x42213A748CB2FBEC


def test_the_routed_string_is_topic_hash_key() -> None:
    assert index_key("T", "Aa") == "T#Aa"
    assert shard_of("T", "Aa", 100) == shard_of_hash(key_hash64("T#Aa"), 100)


def test_one_shard_owns_everything_and_shard_counts_below_one_are_refused() -> None:
    assert shard_of("T", "anything", 1) == 0
    with pytest.raises(InvalidArgument):
        shard_of("T", "k", 0)
    with pytest.raises(InvalidArgument):
        shard_of_hash(5, -1)


def test_shards_are_spread_evenly() -> None:
    counts = Counter(shard_of("T", f"key-{i}", 8) for i in range(16_000))
    assert set(counts) == set(range(8))
    assert all(1_700 < c < 2_300 for c in counts.values()), counts


def test_growing_the_shard_count_moves_keys_only_to_the_new_shards() -> None:
    keys = [f"order-{i}" for i in range(5_000)]
    for old, new in [(1, 2), (3, 4), (4, 7), (8, 16)]:
        moved = 0
        for k in keys:
            before, after = shard_of("T", k, old), shard_of("T", k, new)
            if before != after:
                assert after >= old, (k, old, new, before, after)
                moved += 1
        # about (new - old) / new of the keys move
        assert abs(moved / len(keys) - (new - old) / new) < 0.05


# -- the engine's batch versions --------------------------------------------------------------


keys_strategy = st.lists(st.text(max_size=40), max_size=30)


@settings(max_examples=200)
@given(keys_strategy)
def test_batch_java_hash_equals_string_hashcode_for_any_text(keys: list[str]) -> None:
    assert keyhash.java_hashes(keys).tolist() == [java_string_hash(k) for k in keys]
    assert keyhash.index_hashes(keys).tolist() == [index_key_hash(k) for k in keys]


@settings(max_examples=200)
@given(keys_strategy, st.integers(0, 5))
def test_hashes_of_utf8_buffers_equal_those_of_the_strings(keys: list[str], skip: int) -> None:
    """java_hashes_utf8 over an Arrow-style column (bytes back to back, offsets, starting
    anywhere in the buffer) hashes as java_hashes does the strings."""
    parts = [k.encode("utf-8") for k in keys]
    data = np.frombuffer(b"#" * skip + b"".join(parts) + b"tail", dtype=np.uint8)
    offsets = skip + np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    assert keyhash.java_hashes_utf8(data, offsets).tolist() == keyhash.java_hashes(keys).tolist()
    assert keyhash.index_hashes_utf8(data, offsets).tolist() == [index_key_hash(k) for k in keys]


def test_hashes_of_utf8_buffers_refuse_bytes_that_are_no_utf8_and_offsets_out_of_place() -> None:
    good = np.frombuffer(b"abc", dtype=np.uint8)
    for data, offsets in (
        (b"\xc3", [0, 1]),  # a cut sequence
        (b"\xed\xa0\x80", [0, 3]),  # an encoded surrogate
        (b"\xc0\xaf", [0, 2]),  # an overlong form
    ):
        with pytest.raises(ValueError, match="no UTF-8"):
            keyhash.java_hashes_utf8(np.frombuffer(data, dtype=np.uint8), np.array(offsets))
    for offsets in ([0, 4], [2, 1], [-1, 2]):
        with pytest.raises(ValueError, match="not within the data"):
            keyhash.java_hashes_utf8(good, np.array(offsets))
    assert keyhash.java_hashes_utf8(good, np.array([], dtype=np.int64)).tolist() == []


def test_batch_java_hash_handles_surrogate_pairs_long_keys_and_the_min_value() -> None:
    keys = ["😀", "a😀b", "x" * 5_000, "", "polygenelubricants", "GydZG_", "DESIGNING WORKHOUSES"]
    assert keyhash.java_hashes(keys).tolist() == [java_string_hash(k) for k in keys]
    # many lengths, Latin-1, two-byte and four-byte characters, and lone surrogates (a Java
    # string may hold them; a str from a frame never does, but a caller's may)
    many = [("é" if i % 3 else "a") * i + "😀" * (i % 2) for i in range(120)]
    many += ["\ud800", "a\udfffb", "\u4e2d\ud83d"]
    assert keyhash.java_hashes(many).tolist() == [java_string_hash(k) for k in many]
    ascii_many = ["k" * i for i in range(100)]
    assert keyhash.java_hashes(ascii_many).tolist() == [java_string_hash(k) for k in ascii_many]
    # "polygenelubricants".hashCode() is Integer.MIN_VALUE: RocketMQ's abs maps it to 0.
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert keyhash.index_hashes(["polygenelubricants"]).tolist() == [0]


@settings(max_examples=100)
@given(keys_strategy, st.integers(1, 300))
def test_batch_shards_agree_with_the_shared_function(keys: list[str], count: int) -> None:
    h64 = keyhash.hashes64(keys)
    assert [int(x) for x in h64] == [key_hash64(k) for k in keys]
    got = keyhash.jump_shards(h64, count).tolist()
    assert got == [shard_of_hash(key_hash64(k), count) for k in keys]


def test_batch_shards_agree_for_many_keys_and_shard_counts() -> None:
    rng = random.Random(7)
    keys = [f"T#{rng.getrandbits(64):x}-{i}" for i in range(20_000)]
    h64 = keyhash.hashes64(keys)
    for count in (2, 3, 5, 16, 1_000, 2**31 - 1):
        expected = [shard_of_hash(key_hash64(k), count) for k in keys[:3_000]]
        assert keyhash.jump_shards(h64[:3_000], count).tolist() == expected
    # extreme 64-bit values (the LCG and the shift at their edges)
    edges = np.array([0, 1, 2**63, 2**64 - 1, 2**33 - 1, 2**33], dtype=np.uint64)
    for count in (2, 7, 1_024):
        assert keyhash.jump_shards(edges, count).tolist() == [
            shard_of_hash(int(x), count) for x in edges
        ]
