"""The producer table in the checkpoint (version 2) and the subscriber table: layouts pinned,
round trips, and damage always reported as CorruptFile, never half-read."""

from __future__ import annotations

import struct

import pytest

from mqstore.errors import CorruptFile
from mqstore.formats.commitlog_checkpoint import (
    CHECKPOINT_MAGIC,
    SUBSCRIBERS_MAGIC,
    Checkpoint,
    ProducerEntry,
    ProducerRequest,
    SubscriberOffset,
    decode_checkpoint,
    decode_subscribers,
    encode_checkpoint,
    encode_subscribers,
)
from mqstore.formats.framing import frame, unframe

STORE_ID = bytes(range(16))


def with_producers() -> Checkpoint:
    return Checkpoint(
        STORE_ID,
        flushed_offset=9000,
        min_offset=0,
        written_at_ms=1_700_000_000_000,
        queue_offsets={("T", 1): 5},
        producers=[
            ProducerEntry(
                "host:1:日本",
                2**64 - 1,
                [
                    ProducerRequest(2**64 - 2, 3, 100, 400),
                    ProducerRequest(2**64 - 1, 4, 400, 500, ((0, 6), (2, 7))),
                ],
            ),
            ProducerEntry("q", 0, []),
        ],
    )


def test_a_checkpoint_with_producers_round_trips_as_version_2() -> None:
    ckpt = with_producers()
    raw = encode_checkpoint(ckpt)
    assert unframe(CHECKPOINT_MAGIC, raw)[0] == 2
    assert decode_checkpoint(raw) == ckpt


def test_a_checkpoint_without_producers_is_still_version_1() -> None:
    ckpt = Checkpoint(STORE_ID, 10, 0, 1, {("T", 0): 1})
    assert unframe(CHECKPOINT_MAGIC, encode_checkpoint(ckpt))[0] == 1


def test_the_producer_table_layout() -> None:
    ckpt = Checkpoint(
        STORE_ID, 10, 0, 1, {}, [ProducerEntry("p", 7, [ProducerRequest(7, 2, 0, 10, ((1, 6),))])]
    )
    _, payload = unframe(CHECKPOINT_MAGIC, encode_checkpoint(ckpt))
    assert payload == (
        STORE_ID
        + struct.pack(">qqqI", 10, 0, 1, 0)
        + struct.pack(">I", 1)
        + struct.pack(">H", 1)
        + b"p"
        + struct.pack(">QH", 7, 1)
        + struct.pack(">QIqqI", 7, 2, 0, 10, 1)
        + struct.pack(">IB", 1, 6)
    )


def test_one_flipped_bit_anywhere_in_a_producer_checkpoint_is_corrupt() -> None:
    raw = encode_checkpoint(with_producers())
    for i in range(len(raw)):
        flipped = bytearray(raw)
        flipped[i] ^= 1 << (i % 8)
        with pytest.raises(CorruptFile):
            decode_checkpoint(bytes(flipped))


def test_a_version_2_frame_whose_producer_table_is_missing_or_short_is_corrupt() -> None:
    _, v1_payload = unframe(CHECKPOINT_MAGIC, encode_checkpoint(Checkpoint(STORE_ID, 1)))
    with pytest.raises(CorruptFile, match="version 2"):
        decode_checkpoint(frame(CHECKPOINT_MAGIC, 2, v1_payload))
    _, payload = unframe(CHECKPOINT_MAGIC, encode_checkpoint(with_producers()))
    with pytest.raises(CorruptFile, match="version 2"):
        decode_checkpoint(frame(CHECKPOINT_MAGIC, 2, payload[:-3]))
    with pytest.raises(CorruptFile, match="stray"):
        decode_checkpoint(frame(CHECKPOINT_MAGIC, 2, payload + b"\x00"))


# -- subscribers --------------------------------------------------------------------------------


def test_the_subscriber_table_round_trips() -> None:
    subs = [SubscriberOffset("cq-0", 123, 5), SubscriberOffset("index-日本", 0, 0)]
    assert decode_subscribers(encode_subscribers(STORE_ID, subs)) == (STORE_ID, subs)
    assert decode_subscribers(encode_subscribers(STORE_ID, [])) == (STORE_ID, [])


def test_the_subscriber_table_layout() -> None:
    _, payload = unframe(
        SUBSCRIBERS_MAGIC, encode_subscribers(STORE_ID, [SubscriberOffset("a", 7, 9)])
    )
    assert payload == STORE_ID + struct.pack(">IH", 1, 1) + b"a" + struct.pack(">qq", 7, 9)


@pytest.mark.parametrize(
    "payload",
    [
        STORE_ID[:10],
        STORE_ID + struct.pack(">I", 1),
        STORE_ID + struct.pack(">IH", 1, 5) + b"ab",
        STORE_ID + struct.pack(">I", 0) + b"x",
        STORE_ID + struct.pack(">IH", 1, 1) + b"\xff" + struct.pack(">qq", 1, 1),
    ],
    ids=["short-store-id", "no-entry", "id-cut", "stray", "not-utf8"],
)
def test_a_malformed_subscriber_table_is_corrupt(payload: bytes) -> None:
    with pytest.raises(CorruptFile):
        decode_subscribers(frame(SUBSCRIBERS_MAGIC, 1, payload))


def test_a_subscriber_table_of_another_version_or_magic_is_corrupt() -> None:
    _, payload = unframe(SUBSCRIBERS_MAGIC, encode_subscribers(STORE_ID, []))
    with pytest.raises(CorruptFile, match="version"):
        decode_subscribers(frame(SUBSCRIBERS_MAGIC, 2, payload))
    with pytest.raises(CorruptFile, match="magic"):
        decode_subscribers(encode_checkpoint(Checkpoint(STORE_ID, 0)))
