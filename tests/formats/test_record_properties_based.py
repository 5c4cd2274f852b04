"""Property-based checks of the record codec: round trips, and no input makes the reader raise."""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.formats import sysflag
from mqstore.formats.properties import encode_properties
from mqstore.formats.record import (
    MAGIC_V1,
    MAGIC_V2,
    Bad,
    Blank,
    Record,
    encode_record,
    fields_without_body,
    read_record,
    record_crc,
    record_crc_property,
    record_length,
    without_body,
)

# Modest example counts: the suite shares two cores with other developers.
ROUND_TRIP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=300, deadline=None)

ordinary_topics = st.from_regex(r"[%|a-zA-Z0-9_-]{1,127}", fullmatch=True).filter(
    lambda t: not t.startswith(("%RETRY%", "%DLQ%"))
)
system_topics = st.builds(
    lambda prefix, rest: prefix + rest,
    st.sampled_from(["%RETRY%", "%DLQ%"]),
    st.from_regex(r"[a-zA-Z0-9_-]{0,240}", fullmatch=True),
)
topics = st.one_of(ordinary_topics, system_topics)

# Keys and values without the separators; empty ones are left to test_properties.py.
prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
    min_size=1,
    max_size=20,
)
properties = st.dictionaries(prop_text, prop_text, max_size=6)

ipv4 = st.builds(
    lambda a, p: a + struct.pack(">i", p),
    st.binary(min_size=4, max_size=4),
    st.integers(0, 65535),
)
ipv6 = st.builds(
    lambda a, p: a + struct.pack(">i", p),
    st.binary(min_size=16, max_size=16),
    st.integers(0, 65535),
)
hosts = st.one_of(ipv4, ipv6)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
# The V6 bits are the codec's to set; every other bit is the producer's.
user_sys_flags = st.integers(0, 2**31 - 1).map(
    lambda f: f & ~(sysflag.BORNHOST_V6 | sysflag.STOREHOST_V6)
)


@ROUND_TRIP
@given(
    topic=topics,
    queue_id=st.integers(0, 65535),
    body=st.binary(max_size=5000),
    props=properties,
    flag=i32,
    queue_offset=st.integers(0, 2**63 - 1),
    physical_offset=st.integers(0, 2**63 - 1),
    sys_flag=user_sys_flags,
    born_ts=i64,
    born_host=hosts,
    store_ts=i64,
    store_host=hosts,
    reconsume=i32,
    prepared_tx=i64,
)
def test_encode_then_read_returns_every_field(
    topic: str,
    queue_id: int,
    body: bytes,
    props: dict[str, str],
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_ts: int,
    born_host: bytes,
    store_ts: int,
    store_host: bytes,
    reconsume: int,
    prepared_tx: int,
) -> None:
    raw_props = encode_properties(props)
    raw = encode_record(
        topic=topic,
        queue_id=queue_id,
        body=body,
        properties=raw_props,
        flag=flag,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        sys_flag=sys_flag,
        born_timestamp_ms=born_ts,
        born_host=born_host,
        store_timestamp_ms=store_ts,
        store_host=store_host,
        reconsume_times=reconsume,
        prepared_tx_offset=prepared_tx,
    )
    expected_flags = sys_flag
    if len(born_host) == 20:
        expected_flags |= sysflag.BORNHOST_V6
    if len(store_host) == 20:
        expected_flags |= sysflag.STOREHOST_V6
    assert len(raw) == record_length(
        len(body),
        len(topic),
        len(raw_props) + 20,  # the whole-record CRC property
        born_host_bytes=len(born_host),
        store_host_bytes=len(store_host),
        v2=len(topic) > 127,
    )
    # Inside a larger buffer, at a non-zero position, with the position as expected offset.
    buf = b"\x5a" * 13 + raw + b"\xa5" * 9
    got = read_record(buf, 13, 13 + len(raw), expected_offset=physical_offset)
    assert isinstance(got, Record)
    assert got.total_size == len(raw)
    assert got.magic == (MAGIC_V2 if len(topic) > 127 else MAGIC_V1)
    assert got.topic == topic
    assert got.queue_id == queue_id
    assert got.body == body
    assert got.properties == raw_props
    assert got.record_crc == record_crc(raw, 0, len(raw))
    assert raw.endswith(record_crc_property(got.record_crc))
    assert got.properties_dict() == props
    assert got.flag == flag
    assert got.queue_offset == queue_offset
    assert got.physical_offset == physical_offset
    assert got.sys_flag == expected_flags
    assert got.born_timestamp_ms == born_ts
    assert got.born_host == born_host
    assert got.store_timestamp_ms == store_ts
    assert got.store_host == store_host
    assert got.reconsume_times == reconsume
    assert got.prepared_tx_offset == prepared_tx
    # The record with its body cut out (what a lazily decoded message keeps) is the bytes
    # before the body and after it, and the check-free reader of it gives read_record's values.
    cut = without_body(raw)
    header = len(raw) - len(body) - len(topic.encode()) - (2 if len(topic) > 127 else 1)
    header -= 2 + len(raw_props) + 20
    assert cut == raw[:header] + raw[header + len(body) :]
    assert without_body(memoryview(buf)[13 : 13 + len(raw)]) == cut
    fields = fields_without_body(cut)
    for name in fields._fields:
        assert getattr(fields, name) == getattr(got, name), name
    assert fields_without_body(memoryview(b"\x5a" + cut)[1:]) == fields


@FUZZ
@given(data=st.binary(max_size=600), pos=st.integers(0, 600), check_crc=st.booleans())
def test_read_record_on_arbitrary_bytes_never_raises(
    data: bytes, pos: int, check_crc: bool
) -> None:
    pos = min(pos, len(data))
    got = read_record(data, pos, len(data), check_crc=check_crc, expected_offset=pos)
    assert isinstance(got, Record | Blank | Bad)


# Arbitrary bytes rarely get past the magic check; start from a valid header and scribble.
@FUZZ
@given(
    magic=st.sampled_from([MAGIC_V1, MAGIC_V2]),
    flags=st.sampled_from([0, 0x10, 0x20, 0x30]),
    total=st.integers(-(2**31), 2**31 - 1) | st.integers(0, 400),
    tail=st.binary(min_size=0, max_size=400),
)
def test_read_record_on_plausible_headers_with_random_contents_never_raises(
    magic: int, flags: int, total: int, tail: bytes
) -> None:
    head = bytearray(struct.pack(">ii", total, magic) + bytes(28) + struct.pack(">i", flags))
    data = bytes(head) + tail
    got = read_record(data, 0, len(data))
    assert isinstance(got, Record | Blank | Bad)
    if isinstance(got, Record):
        assert got.total_size == total <= len(data)


@settings(max_examples=60, deadline=None)
@given(body=st.binary(min_size=1, max_size=300), data=st.data())
def test_any_single_byte_change_in_body_or_lengths_is_never_read_as_the_same_record(
    body: bytes, data: st.DataObject
) -> None:
    raw = encode_record(topic="T", queue_id=0, body=body, properties=b"K\x01v\x02")
    # Bytes covered by a check: TOTALSIZE, MAGIC, BODYCRC, BODYLENGTH..end of record.
    covered = [*range(0, 12), *range(84, len(raw))]
    pos = data.draw(st.sampled_from(covered))
    delta = data.draw(st.integers(1, 255))
    mutated = bytearray(raw)
    mutated[pos] = (mutated[pos] + delta) % 256
    got = read_record(bytes(mutated), 0, len(mutated))
    assert isinstance(got, Record | Blank | Bad)
    if isinstance(got, Record):
        # Only a change that the format cannot see (inside the topic or properties text)
        # may still read as a record, and then it reads differently, never silently the same.
        assert (got.topic, got.properties) != ("T", b"K\x01v\x02")
