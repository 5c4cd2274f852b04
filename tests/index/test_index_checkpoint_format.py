"""The index checkpoint and the companion header: round trips and every way they are refused."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.errors import CorruptFile
from mqstore.formats import index_hash64
from mqstore.formats.index_checkpoint import (
    FILE_RECORD_BYTES,
    FileRecord,
    IndexCheckpoint,
    decode_checkpoint,
    encode_checkpoint,
)

i64 = st.integers(-(2**63), 2**63 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
u32 = st.integers(0, 2**32 - 1)

records = st.builds(
    FileRecord,
    name_ms=i64,
    slot_num=i32,
    entry_num=i32,
    start_offset=i64,
    end_offset=i64,
    begin_ts_ms=i64,
    end_ts_ms=i64,
    begin_phy=i64,
    end_phy=i64,
    index_count=i32,
    flags=u32,
    entries_crc=u32,
    head_crc=u32,
    hash64_crc=u32,
)
checkpoints = st.builds(
    IndexCheckpoint,
    store_id=st.binary(min_size=16, max_size=16),
    confirmed_offset=i64,
    min_offset=i64,
    written_at_ms=i64,
    shard_count=i32,
    shard_index=i32,
    exact=st.booleans(),
    clean_close=st.booleans(),
    files=st.lists(records, max_size=5),
)


@given(checkpoints)
def test_checkpoint_round_trips(ckpt: IndexCheckpoint) -> None:
    assert decode_checkpoint(encode_checkpoint(ckpt)) == ckpt


def test_a_checkpoint_record_is_84_bytes_after_a_56_byte_head() -> None:
    one = encode_checkpoint(IndexCheckpoint(files=[FileRecord(1, 4, 8, 0, 0)]))
    none = encode_checkpoint(IndexCheckpoint())
    assert len(one) - len(none) == FILE_RECORD_BYTES == 84
    assert len(none) == 14 + 56


def test_every_flipped_byte_of_a_checkpoint_is_refused() -> None:
    data = encode_checkpoint(IndexCheckpoint(files=[FileRecord(1, 4, 8, 0, 0)]))
    for pos in range(len(data)):
        bad = bytearray(data)
        bad[pos] ^= 0x20
        with pytest.raises(CorruptFile):
            decode_checkpoint(bytes(bad))


def test_a_truncated_checkpoint_is_refused() -> None:
    data = encode_checkpoint(IndexCheckpoint(files=[FileRecord(1, 4, 8, 0, 0)]))
    for cut in (0, 10, len(data) - 1):
        with pytest.raises(CorruptFile):
            decode_checkpoint(data[:cut])


def test_a_store_id_must_be_16_bytes() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        encode_checkpoint(IndexCheckpoint(store_id=b"short"))


def test_companion_header_round_trips_and_refuses_damage() -> None:
    head = index_hash64.encode_header(1_000)
    assert len(head) == index_hash64.HEADER_BYTES == 16
    assert index_hash64.decode_header(head) == 1_000
    assert index_hash64.file_bytes(1_000) == 16 + 8_000
    for pos in range(16):
        bad = bytearray(head)
        bad[pos] ^= 0x01
        with pytest.raises(CorruptFile):
            index_hash64.decode_header(bytes(bad))
    with pytest.raises(CorruptFile):
        index_hash64.decode_header(head[:15])
    other = struct.pack(">4sHHi", b"NOPE", 1, 0, 5)
    with pytest.raises(CorruptFile, match="not a companion"):
        index_hash64.decode_header(other + struct.pack(">I", crc32c.crc32c(other)))
