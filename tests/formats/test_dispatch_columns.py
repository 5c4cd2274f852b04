"""dispatch_columns, the compiled dispatch walk (formats/_core_dispatch.pxi), against the
reference: read_record for each record, property_value for TAGS, KEYS and UNIQ_KEY and
tags_code for the TAGS value. Over valid records of every shape and damaged ones, it takes the
same records with the same fields and stops where the reference stops, for the same reason."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.formats import sysflag
from mqstore.formats._core import (
    DISPATCH_END,
    DISPATCH_PAST,
    DISPATCH_RECORD,
    dispatch_columns,
    dispatch_frame,
    dispatch_tail,
)
from mqstore.formats.javahash import tags_code
from mqstore.formats.properties import KEYS, TAGS, UNIQ_KEY, property_value
from mqstore.formats.record import (
    RECORD_CRC_BYTES,
    Record,
    encode_blank,
    encode_record,
    field_spans,
    read_record,
    record_crc,
    record_crc_property,
)
from mqstore.rpc.dispatch_codec import decode_dispatch
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb

V6_HOST = bytes(range(16)) + b"\x00\x00\x10\x00"
V4_HOST = b"\x7f\x00\x00\x01\x00\x00\x00\x00"
NAMES = [TAGS, KEYS, UNIQ_KEY, "TAG", "xTAGS", "KEYSx", "UNIQ", "other"]
# Text without NUL and without surrogates (UTF-8 cannot carry them); 0x01 and 0x02 come in
# through the segments below.
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))


@st.composite
def segment(draw: st.DrawFn) -> bytes:
    """One property segment: a pair, a pair with an empty value or a 0x01 inside its value,
    a name without its 0x01, or bytes that are not UTF-8."""
    name = draw(st.sampled_from(NAMES)).encode()
    value = draw(TEXT.filter(lambda t: "\x02" not in t)).encode()
    kind = draw(st.sampled_from(["pair", "pair", "pair", "empty", "two_seps", "bare", "junk"]))
    if kind == "pair":
        return name + b"\x01" + value
    if kind == "empty":
        return name + b"\x01"
    if kind == "two_seps":
        return name + b"\x01\x01" + value
    if kind == "bare":
        return name
    return name + b"\x01" + draw(st.binary(max_size=6)).replace(b"\x02", b"") + b"\xff\xc3"


@st.composite
def properties(draw: st.DrawFn) -> bytes:
    """Segments joined by 0x02 and ended by it (as the encoder requires), repeated names
    included; sometimes empty segments between them."""
    segments = draw(st.lists(segment(), max_size=6))
    if not segments:
        return b""
    glue = b"\x02\x02" if draw(st.booleans()) else b"\x02"
    return glue.join(segments) + b"\x02"


@st.composite
def record(draw: st.DrawFn, offset: int) -> bytes:
    """A record at `offset`: topics ASCII and not (V2 past 127 characters), IPv6 hosts, bodies
    empty or not, with the whole-record CRC or without. The encoder takes only the topics a
    producer may name; the log holds any UTF-8 (a replica's, a converted log's), put in place
    of a placeholder here."""
    topic = draw(
        st.one_of(
            st.sampled_from(["T", "orders", "%RETRY%" + "t" * 130]),
            TEXT.filter(lambda t: 0 < len(t.encode()) <= 120),
        )
    )
    raw_topic = topic.encode()
    born_v6, store_v6 = draw(st.booleans()), draw(st.booleans())
    crc = draw(st.booleans())
    raw = bytearray(
        encode_record(
            topic=topic if len(topic) > 127 else "t" * len(raw_topic),
            queue_id=draw(st.integers(0, 7)),
            body=draw(st.sampled_from([b"", b"x", bytes(range(1, 200))])),
            properties=draw(properties()),
            physical_offset=offset,
            queue_offset=draw(st.integers(0, 1 << 40)),
            sys_flag=(sysflag.BORNHOST_V6 if born_v6 else 0)
            | (sysflag.STOREHOST_V6 if store_v6 else 0)
            | draw(st.sampled_from([0, sysflag.COMPRESSED, sysflag.TRANSACTION_PREPARED_TYPE])),
            born_host=V6_HOST if born_v6 else V4_HOST,
            store_host=V6_HOST if store_v6 else V4_HOST,
            store_timestamp_ms=draw(st.integers(0, 1 << 45)),
            record_crc=crc,
        )
    )
    ((start, end),) = [(a, b) for name, a, b in field_spans(raw) if name == "TOPIC"]
    raw[start:end] = raw_topic
    if crc:
        raw[-RECORD_CRC_BYTES:] = record_crc_property(record_crc(raw, 0, len(raw)))
    return bytes(raw)


@st.composite
def segments(draw: st.DrawFn) -> tuple[bytes, int]:
    """(records laid end to end from a base offset, maybe one damaged or followed by a blank
    or zeros, the base offset)."""
    base = draw(st.integers(0, 1 << 40))
    raws: list[bytes] = []
    for _ in range(draw(st.integers(1, 6))):
        raws.append(draw(record(base + sum(map(len, raws)))))
    blob = bytearray(b"".join(raws))
    damage = draw(st.sampled_from(["none", "none", "flip", "flip_tail", "blank", "zeros"]))
    if damage in ("flip", "flip_tail"):
        last = len(blob) - len(raws[-1])
        lowest = len(blob) - 20 if damage == "flip_tail" else draw(st.sampled_from([0, last]))
        blob[draw(st.integers(lowest, len(blob) - 1))] ^= draw(st.integers(1, 255))
    elif damage == "blank":
        blob += encode_blank(draw(st.integers(8, 200)))
    elif damage == "zeros":
        blob += bytes(draw(st.integers(1, 100)))
    return bytes(blob), base


def reference(
    blob: bytes, base: int, limit: int, keys: bool, rows_max: int, bytes_max: int
) -> tuple[int, int, int, list[tuple[Any, ...]]]:
    """(why, where, bytes taken, entries) by read_record and the properties' Python readers."""
    pos = taken = 0
    rows: list[tuple[Any, ...]] = []
    while pos < limit and len(rows) < rows_max and taken < bytes_max:
        found = read_record(blob, pos, len(blob), check_crc=True, expected_offset=base + pos)
        if not isinstance(found, Record):
            return DISPATCH_RECORD, pos, taken, rows
        if pos + found.total_size > limit:
            return DISPATCH_PAST, pos, taken, rows
        props = found.properties
        rows.append(
            (
                found.topic,
                found.queue_id,
                found.queue_offset,
                found.physical_offset,
                found.total_size,
                tags_code(property_value(props, TAGS) or None),
                found.store_timestamp_ms,
                found.sys_flag,
            )
            + ((property_value(props, KEYS), property_value(props, UNIQ_KEY)) if keys else ())
        )
        pos += found.total_size
        taken += found.total_size
    return DISPATCH_END, pos, taken, rows


@settings(max_examples=400, deadline=None)
@given(
    segments(),
    st.booleans(),
    st.integers(0, 1 << 16),
    st.integers(1, 8),
    st.integers(1, 2000),
)
def test_the_compiled_dispatch_walk_equals_read_record_and_property_value(
    drawn: tuple[bytes, int], keys: bool, cut: int, rows_max: int, bytes_max: int
) -> None:
    blob, base = drawn
    limit = len(blob) - min(cut, len(blob)) if cut % 3 == 0 else len(blob)  # a limit mid-way
    topics: list[str] = []
    why, pos, taken, entries, columns, key_columns = dispatch_columns(
        blob, 0, limit, len(blob), base, {}, topics, keys, rows_max, bytes_max
    )
    batch = pb.DispatchBatch.FromString(columns + key_columns)
    batch.topics.extend(topics)
    want_why, want_pos, want_taken, want_rows = reference(
        blob, base, limit, keys, rows_max, bytes_max
    )
    got_rows = [
        (
            e.topic,
            e.queue_id,
            e.queue_offset,
            e.commit_log_offset,
            e.size,
            e.tags_code,
            e.store_timestamp_ms,
            e.sys_flag,
        )
        + ((e.keys, e.uniq_key) if keys else ())
        for e in decode_dispatch(batch)
    ]
    assert (why, pos, taken, entries) == (want_why, want_pos, want_taken, len(want_rows))
    assert got_rows == want_rows
    assert topics == list(dict.fromkeys(row[0] for row in want_rows))  # in first-use order
    assert not pb.DispatchBatch.FromString(columns).keys  # the keys come apart
    if not keys:
        assert key_columns == b""


def test_a_value_is_the_last_well_formed_segments_of_its_name() -> None:
    # TAGS: the last with a value (UTF-8); KEYS: not xKEYS, and a value may hold 0x01.
    props = (
        b"TAGS\x01first\x02TAGS\x01\x02xKEYS\x01no\x02KEYS\x01\x01odd\x02TAGS\x01\xe6\x97\xa5\x02"
    )
    raw = encode_record(topic="t", queue_id=0, body=b"b", properties=props, record_crc=True)
    batch = pb.DispatchBatch.FromString(
        b"".join(dispatch_columns(raw, 0, len(raw), len(raw), 0, {}, [], True, 1, 1)[-2:])
    )
    assert list(batch.tags_codes) == [tags_code("日")]
    assert list(batch.keys) == ["\x01odd"] and list(batch.uniq_keys) == [""]


offsets = st.integers(0, 2**62)


@settings(max_examples=300, deadline=None)
@given(
    offsets,
    offsets,
    st.lists(st.text(max_size=20), max_size=4),
    st.lists(st.tuples(offsets, offsets), max_size=4),
)
def test_the_compiled_frame_tail_is_the_batch_protobuf_serializes(
    start: int, next_offset: int, topics: list[str], corrupt: list[tuple[int, int]]
) -> None:
    """dispatch_tail byte for byte as protobuf writes those fields (in field order, defaults
    left out, the corrupt ranges packed)."""
    want = pb.DispatchBatch(
        start_offset=start,
        next_offset=next_offset,
        topics=topics,
        corrupt_starts=[s for s, _ in corrupt],
        corrupt_ends=[e for _, e in corrupt],
    )
    got = dispatch_tail(
        start, next_offset, topics, [s for s, _ in corrupt], [e for _, e in corrupt]
    )
    assert got == want.SerializeToString()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(offsets, max_size=40), max_size=5))
def test_a_compiled_frame_is_its_pieces_as_the_response_batch(pieces: list[list[int]]) -> None:
    """dispatch_frame: the batch field's key and varint length, then the pieces back to back:
    a SubscribeResponse whose batch parses as the pieces' fields together (here each a packed
    corrupt_starts, appended in order)."""
    fields = [pb.DispatchBatch(corrupt_starts=p).SerializeToString() for p in pieces]
    wire = dispatch_frame(tuple(fields))
    body = b"".join(fields)
    length = pb.DispatchBatch(start_offset=len(body)).SerializeToString()[1:]  # protobuf's varint
    assert wire == b"\x12" + (length or b"\x00") + body
    want = pb.DispatchBatch(corrupt_starts=[v for p in pieces for v in p])
    assert pb.SubscribeResponse.FromString(wire) == pb.SubscribeResponse(batch=want)
