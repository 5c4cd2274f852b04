"""The CRC32C frame around mqstore's own files, and the checkpoint and store meta inside it."""

from __future__ import annotations

import struct

import crc32c
import pytest

from mqstore.errors import CorruptFile, MqstoreError
from mqstore.formats.commitlog_checkpoint import (
    CHECKPOINT_MAGIC,
    META_MAGIC,
    Checkpoint,
    StoreMeta,
    decode_checkpoint,
    decode_meta,
    encode_checkpoint,
    encode_meta,
)
from mqstore.formats.framing import FRAME_OVERHEAD_BYTES, frame, unframe

STORE_ID = bytes(range(16))


def sample_checkpoint() -> Checkpoint:
    return Checkpoint(
        store_id=STORE_ID,
        flushed_offset=1_073_741_824 + 4242,
        min_offset=1_073_741_824,
        written_at_ms=1_700_000_000_000,
        queue_offsets={("TopicA", 0): 10, ("TopicA", 1): 0, ("日本-topic", 7): 2**40},
    )


# -- frame --------------------------------------------------------------------------------------


def test_frame_layout_is_magic_version_length_payload_crc32c() -> None:
    raw = frame(b"ABCD", 3, b"payload")
    head = b"ABCD" + struct.pack(">H", 3) + struct.pack(">I", 7)
    assert raw == head + b"payload" + struct.pack(">I", crc32c.crc32c(head + b"payload"))
    assert len(raw) == FRAME_OVERHEAD_BYTES + 7 == 21


@pytest.mark.parametrize("payload", [b"", b"x", bytes(range(256)) * 10])
def test_frame_round_trips(payload: bytes) -> None:
    assert unframe(b"ABCD", frame(b"ABCD", 9, payload)) == (9, payload)


def test_frame_refuses_a_magic_that_is_not_4_bytes() -> None:
    with pytest.raises(ValueError):
        frame(b"ABC", 1, b"")


@pytest.mark.parametrize("keep", [0, 1, 13, FRAME_OVERHEAD_BYTES - 1])
def test_a_frame_shorter_than_its_overhead_is_corrupt(keep: int) -> None:
    with pytest.raises(CorruptFile, match="shorter"):
        unframe(b"ABCD", frame(b"ABCD", 1, b"")[:keep])


def test_a_frame_with_another_magic_is_corrupt() -> None:
    with pytest.raises(CorruptFile, match="magic"):
        unframe(b"WXYZ", frame(b"ABCD", 1, b"data"))


@pytest.mark.parametrize("change", [-1, 1, 100])
def test_a_frame_whose_length_disagrees_with_the_file_is_corrupt(change: int) -> None:
    raw = bytearray(frame(b"ABCD", 1, b"some payload"))
    struct.pack_into(">I", raw, 6, len(b"some payload") + change)
    with pytest.raises(CorruptFile):
        unframe(b"ABCD", bytes(raw))


def test_a_truncated_or_extended_frame_is_corrupt() -> None:
    raw = frame(b"ABCD", 1, b"some payload")
    with pytest.raises(CorruptFile):
        unframe(b"ABCD", raw[:-1])
    with pytest.raises(CorruptFile):
        unframe(b"ABCD", raw + b"\x00")


def test_the_path_is_named_in_the_error() -> None:
    with pytest.raises(CorruptFile) as exc:
        unframe(b"ABCD", b"", path="/data/checkpoint")
    assert exc.value.path == "/data/checkpoint"


def every_single_bit_flip(raw: bytes) -> list[bytes]:
    out = []
    for i in range(len(raw)):
        for bit in range(8):
            flipped = bytearray(raw)
            flipped[i] ^= 1 << bit
            out.append(bytes(flipped))
    return out


def test_one_flipped_bit_anywhere_in_a_frame_is_corrupt() -> None:
    raw = frame(b"ABCD", 1, b"a payload of some length \x00\xff")
    for flipped in every_single_bit_flip(raw):
        with pytest.raises(CorruptFile):
            unframe(b"ABCD", flipped)


# -- checkpoint ---------------------------------------------------------------------------------


def test_checkpoint_round_trips() -> None:
    ckpt = sample_checkpoint()
    assert decode_checkpoint(encode_checkpoint(ckpt)) == ckpt


def test_an_empty_checkpoint_round_trips() -> None:
    ckpt = Checkpoint(store_id=STORE_ID, flushed_offset=0)
    assert decode_checkpoint(encode_checkpoint(ckpt)) == ckpt


def test_checkpoint_payload_layout() -> None:
    ckpt = Checkpoint(STORE_ID, 100, 50, 7, {("T", 3): 9})
    version, payload = unframe(CHECKPOINT_MAGIC, encode_checkpoint(ckpt))
    assert version == 1
    assert payload == (
        STORE_ID
        + struct.pack(">qqqI", 100, 50, 7, 1)
        + struct.pack(">H", 1)
        + b"T"
        + struct.pack(">iq", 3, 9)
    )


def test_one_flipped_bit_anywhere_in_a_checkpoint_is_corrupt() -> None:
    raw = encode_checkpoint(Checkpoint(STORE_ID, 4096, 0, 1, {("T", 0): 1}))
    for flipped in every_single_bit_flip(raw):
        with pytest.raises(CorruptFile):
            decode_checkpoint(flipped)


@pytest.mark.parametrize("keep", [0, 10, 40])
def test_a_short_checkpoint_is_corrupt(keep: int) -> None:
    with pytest.raises(CorruptFile):
        decode_checkpoint(encode_checkpoint(sample_checkpoint())[:keep])


def test_a_checkpoint_of_an_unknown_version_is_corrupt() -> None:
    _, payload = unframe(CHECKPOINT_MAGIC, encode_checkpoint(sample_checkpoint()))
    with pytest.raises(CorruptFile, match="version 99"):
        decode_checkpoint(frame(CHECKPOINT_MAGIC, 99, payload))


def test_a_store_meta_is_not_read_as_a_checkpoint() -> None:
    with pytest.raises(CorruptFile, match="magic"):
        decode_checkpoint(encode_meta(StoreMeta(STORE_ID, 1, 4096)))


def test_a_checkpoint_whose_queue_table_is_cut_short_is_corrupt() -> None:
    # A frame with a valid CRC around a payload that claims two queues but holds one.
    payload = (
        STORE_ID + struct.pack(">qqqI", 0, 0, 0, 2) + struct.pack(">H", 1) + b"T"
        + struct.pack(">iq", 0, 1)
    )  # fmt: skip
    with pytest.raises(CorruptFile, match="parse"):
        decode_checkpoint(frame(CHECKPOINT_MAGIC, 1, payload))


def test_a_checkpoint_with_stray_bytes_after_its_table_is_corrupt() -> None:
    payload = STORE_ID + struct.pack(">qqqI", 0, 0, 0, 0) + b"\x00"
    with pytest.raises(CorruptFile, match="stray"):
        decode_checkpoint(frame(CHECKPOINT_MAGIC, 1, payload))


def test_a_checkpoint_payload_shorter_than_its_head_is_corrupt() -> None:
    with pytest.raises(CorruptFile, match="short"):
        decode_checkpoint(frame(CHECKPOINT_MAGIC, 1, STORE_ID))


def test_a_checkpoint_topic_that_is_not_utf8_is_corrupt() -> None:
    payload = (
        STORE_ID + struct.pack(">qqqI", 0, 0, 0, 1) + struct.pack(">H", 1) + b"\xff"
        + struct.pack(">iq", 0, 1)
    )  # fmt: skip
    with pytest.raises(CorruptFile):
        decode_checkpoint(frame(CHECKPOINT_MAGIC, 1, payload))


@pytest.mark.parametrize("store_id", [b"short", bytes(17)], ids=["5-bytes", "17-bytes"])
@pytest.mark.parametrize("kind", ["checkpoint", "meta"])
def test_a_store_id_that_is_not_16_bytes_is_refused(kind: str, store_id: bytes) -> None:
    with pytest.raises((ValueError, MqstoreError, struct.error)):
        if kind == "checkpoint":
            encode_checkpoint(Checkpoint(store_id=store_id, flushed_offset=0))
        else:
            encode_meta(StoreMeta(store_id, 0, 4096))


# -- store meta ---------------------------------------------------------------------------------


def test_store_meta_round_trips() -> None:
    meta = StoreMeta(STORE_ID, 1_700_000_000_000, 1 << 30)
    assert decode_meta(encode_meta(meta)) == meta


def test_store_meta_payload_layout() -> None:
    version, payload = unframe(META_MAGIC, encode_meta(StoreMeta(STORE_ID, 5, 4096)))
    assert version == 1
    assert payload == STORE_ID + struct.pack(">qq", 5, 4096)


def test_one_flipped_bit_anywhere_in_a_store_meta_is_corrupt() -> None:
    raw = encode_meta(StoreMeta(STORE_ID, 5, 4096))
    for flipped in every_single_bit_flip(raw):
        with pytest.raises(CorruptFile):
            decode_meta(flipped)


def test_a_short_or_wrong_version_store_meta_is_corrupt() -> None:
    raw = encode_meta(StoreMeta(STORE_ID, 5, 4096))
    with pytest.raises(CorruptFile):
        decode_meta(raw[:-1])
    _, payload = unframe(META_MAGIC, raw)
    with pytest.raises(CorruptFile):
        decode_meta(frame(META_MAGIC, 2, payload))
    with pytest.raises(CorruptFile):
        decode_meta(frame(META_MAGIC, 1, payload[:-1]))
