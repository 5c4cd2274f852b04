"""Poison refused at the door (commitlog_svc/append_checks.py), through a real server: a body
marked compressed that its codec cannot decompress within the body limit, and properties that
are not key 0x01 value 0x02 pairs, are MESSAGE_ILLEGAL naming the field; the messages beside
them are stored as if the poison had never been sent (issue 23, item 3)."""

from __future__ import annotations

import os
import zlib

import lz4.frame
import pytest
import zstandard

from mqstore.formats import sysflag
from mqstore.formats.properties import encode_properties
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from tests.answers import records_of
from tests.commitlog_svc.support import TOPIC, Running, parse

ZLIB = sysflag.COMPRESSED | sysflag.COMPRESSION_ZLIB
LZ4 = sysflag.COMPRESSED | sysflag.COMPRESSION_LZ4
ZSTD = sysflag.COMPRESSED | sysflag.COMPRESSION_ZSTD
BODY_LIMIT = 4 * 1024 * 1024  # MessageLimits.body_bytes_max
PROPS = encode_properties({"TAGS": "t"})


def stored_bodies(svc: Running, response: pb.AppendResponse) -> list[bytes]:
    """The bodies of the records the append stored, read back from the log."""
    ok = [i for i, s in enumerate(response.statuses) if s == pb.PUT_OK]
    got = svc.stub.Read(
        pb.ReadRequest(
            offsets=[response.commit_log_offsets[i] for i in ok],
            sizes=[response.sizes[i] for i in ok],
        )
    )
    return [parse(raw).body for raw in records_of(got)]


def refusal(response: pb.AppendResponse, index: int) -> pb.Refusal:
    (found,) = [r for r in response.refusals if r.index == index]
    return found


@pytest.mark.parametrize(
    ("flag", "body", "says"),
    [
        (ZLIB, b"this is not a zlib stream", "zlib"),
        (sysflag.COMPRESSED, b"old-style mark: zlib too", "zlib"),  # no type bits: zlib
        (ZLIB, zlib.compress(b"cut short " * 200)[:-6], "truncated"),
        (LZ4, b"this is not an lz4 frame", "lz4"),
        (LZ4, lz4.frame.compress(b"cut short " * 200)[:-6], "truncated"),
        (ZSTD, b"this is not a zstd frame", "zstd"),
        # Zip bombs: a few KiB that inflate past the body limit are refused at it.
        (ZLIB, zlib.compress(bytes(BODY_LIMIT + 1), 9), "past the 4194304-byte limit"),
        (LZ4, lz4.frame.compress(bytes(BODY_LIMIT + 1)), "past the 4194304-byte limit"),
        (ZSTD, zstandard.ZstdCompressor().compress(bytes(BODY_LIMIT + 1)), "past"),
        (
            ZSTD,
            zstandard.ZstdCompressor(write_content_size=False).compress(bytes(BODY_LIMIT + 1)),
            "4194304-byte limit",
        ),
    ],
    ids=[
        "zlib-garbage",
        "bare-compressed-bit",
        "zlib-truncated",
        "lz4-garbage",
        "lz4-truncated",
        "zstd-garbage",
        "zlib-bomb",
        "lz4-bomb",
        "zstd-bomb-declared",
        "zstd-bomb-undeclared",
    ],
)
def test_a_compressed_body_that_does_not_decompress_is_refused_and_its_neighbours_stored(
    svc: Running, flag: int, body: bytes, says: str
) -> None:
    good = zlib.compress(b"a good compressed body " * 50)
    response = svc.append(
        pb.MessageBatch(
            topic=TOPIC,
            queue_ids=[0, 0, 0],
            bodies=[b"before", body, good],
            properties=[PROPS] * 3,
            sys_flags=[0, flag, ZLIB],
        )
    )
    assert list(response.statuses) == [pb.PUT_OK, pb.MESSAGE_ILLEGAL, pb.PUT_OK]
    bad = refusal(response, 1)
    assert (bad.status, bad.field) == (pb.MESSAGE_ILLEGAL, "body")
    assert says in bad.reason, bad.reason
    # Stored as if never sent: dense queue offsets, no offsets for the refused one.
    assert list(response.queue_offsets) == [0, -1, 1]
    assert response.commit_log_offsets[1] == -1
    assert stored_bodies(svc, response) == [b"before", good]


def test_unknown_compression_bits_are_refused_naming_the_sys_flag(svc: Running) -> None:
    response = svc.append(
        pb.MessageBatch(topic=TOPIC, queue_ids=[0], bodies=[b"x"], sys_flag=ZLIB | 0x400)
    )
    assert list(response.statuses) == [pb.MESSAGE_ILLEGAL]
    assert refusal(response, 0).field == "sys_flag"
    assert "0x700" in refusal(response, 0).reason


def test_every_codec_the_sdk_writes_is_accepted(svc: Running) -> None:
    original = b"compressible payload " * 300
    bodies = [
        zlib.compress(original),
        lz4.frame.compress(original),
        zstandard.ZstdCompressor().compress(original),
        zstandard.ZstdCompressor(write_content_size=False).compress(original),
        zlib.compress(bytes(BODY_LIMIT)),  # exactly the limit once decompressed
    ]
    response = svc.append_ok(
        pb.MessageBatch(
            topic=TOPIC,
            queue_ids=[0] * 5,
            bodies=bodies,
            sys_flags=[ZLIB, LZ4, ZSTD, ZSTD, ZLIB],
        )
    )
    assert stored_bodies(svc, response) == bodies


@pytest.mark.parametrize(
    ("props", "says"),
    [
        (b"KEYS\x01k1", "after the last 0x02"),
        (b"TAGS\x01a\x02garbage\x02", "pair 1 ('garbage') has no 0x01"),
        (b"\x01value\x02", "empty key"),
        (b"TAGS\x01a\x02\x02", "pair 1 ('') has no 0x01"),
        (b"\x02", "pair 0"),
    ],
)
def test_properties_that_are_not_pairs_are_refused_naming_the_field(
    svc: Running, props: bytes, says: str
) -> None:
    response = svc.append(
        pb.MessageBatch(
            topic=TOPIC,
            queue_ids=[1, 1, 1],
            bodies=[b"m0", b"m1", b"m2"],
            properties=[PROPS, props, PROPS],
        )
    )
    assert list(response.statuses) == [pb.PUT_OK, pb.MESSAGE_ILLEGAL, pb.PUT_OK]
    bad = refusal(response, 1)
    assert bad.field == "properties"
    assert says in bad.reason, bad.reason
    assert list(response.queue_offsets) == [0, -1, 1]
    assert stored_bodies(svc, response) == [b"m0", b"m2"]


def test_properties_rocketmq_writes_are_accepted(svc: Running) -> None:
    """Empty values (RocketMQ writes name 0x01 0x02 for ""), 0x01 inside a value (its parser
    keeps everything after the first 0x01), no properties at all, and non-ASCII text."""
    accepted = [
        b"",
        b"EMPTY\x01\x02TAGS\x01t\x02",
        b"RAW\x01a\x01b\x02",
        "CITY\x01Zürich\x02".encode(),
    ]
    response = svc.append_ok(
        pb.MessageBatch(
            topic=TOPIC, queue_ids=[0] * 4, bodies=[b"a", b"b", b"c", b"d"], properties=accepted
        )
    )
    got = records_of(
        svc.stub.Read(pb.ReadRequest(offsets=response.commit_log_offsets, sizes=response.sizes))
    )
    assert [parse(raw).properties for raw in got] == accepted


def test_a_request_of_nothing_but_poison_stores_nothing(svc: Running) -> None:
    before = svc.status().max_offset
    response = svc.append(
        pb.MessageBatch(topic=TOPIC, queue_ids=[0, 0], bodies=[b"x", b"y"], sys_flag=ZLIB),
        producer_id="p-all-refused",
        sequence=0,
    )
    assert list(response.statuses) == [pb.MESSAGE_ILLEGAL] * 2
    assert [r.index for r in response.refusals] == [0, 1]
    assert svc.status().max_offset == before


def test_a_retry_of_a_request_with_poison_is_answered_as_the_first_time(svc: Running) -> None:
    """The checks are a function of the request: an idempotent retry gives the same answer,
    stores nothing more, and the good messages keep their offsets."""
    request = pb.MessageBatch(
        topic=TOPIC,
        queue_ids=[2, 2, 2, 2],
        bodies=[b"g0", os.urandom(40), b"g2", b"g3"],
        properties=[PROPS, PROPS, PROPS, b"broken"],
        sys_flags=[0, ZLIB, 0, 0],
    )
    first = svc.append(request, producer_id="p-retry", sequence=5)
    assert list(first.statuses) == [pb.PUT_OK, pb.MESSAGE_ILLEGAL, pb.PUT_OK, pb.MESSAGE_ILLEGAL]
    assert [(r.index, r.field) for r in first.refusals] == [(1, "body"), (3, "properties")]
    end = svc.status().max_offset
    again = svc.append(request, producer_id="p-retry", sequence=5)
    assert again.duplicate and list(again.statuses) == list(first.statuses)
    assert list(again.commit_log_offsets) == list(first.commit_log_offsets)
    assert list(again.queue_offsets) == [0, -1, 1, -1]
    assert svc.status().max_offset == end


def test_append_stream_refuses_poison_the_same_way(svc: Running) -> None:
    requests = [
        pb.AppendRequest(
            batches=[
                pb.MessageBatch(
                    topic=TOPIC, queue_ids=[3, 3], bodies=[b"ok", b"nope"], sys_flags=[0, LZ4]
                )
            ],
            sequence=s,
        )
        for s in range(3)
    ]
    answers = list(svc.stub.AppendStream(iter(requests), timeout=20))
    assert [list(a.statuses) for a in answers] == [[pb.PUT_OK, pb.MESSAGE_ILLEGAL]] * 3
    assert [a.queue_offsets[0] for a in answers] == [0, 1, 2]


def test_refusals_and_sync_flush_keep_their_statuses(start: object) -> None:
    svc = start(flush="sync")  # type: ignore[operator]
    response = svc.append(
        pb.MessageBatch(
            topic=TOPIC, queue_ids=[0, 0], bodies=[b"bad", b"good"], sys_flags=[ZLIB, 0]
        )
    )
    assert list(response.statuses) == [pb.MESSAGE_ILLEGAL, pb.PUT_OK]
