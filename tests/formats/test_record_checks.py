"""read_record's checks (rocketmq-store.md §5.4), resynchronisation, and the append limits (§1.6).

Each row of the check table gets its own test; none of them may raise, whatever the bytes.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Callable

import pytest

from mqstore.errors import MessageIllegal, PropertiesTooLarge
from mqstore.formats.record import (
    BODY_CRC_MISMATCH,
    DAMAGED_RECORD_CRC,
    MAGIC_V1,
    NO_RECORD_CRC,
    RECORD_CRC_DAMAGED,
    RECORD_CRC_MISMATCH,
    Bad,
    Blank,
    Buffer,
    Record,
    encode_blank,
    encode_record,
    find_next_record,
    prepare_message,
    read_record,
    record_crc_property,
    stored_record_crc,
)
from mqstore.formats.record_columns import check_records
from mqstore.limits import MessageLimits

BODY = b"check-table-body"  # 16 bytes
PROPS = b"TAGS\x01T\x02"


def rec(
    *, physical_offset: int = 0, topic: str = "Topic", body: bytes = BODY, record_crc: bool = True
) -> bytes:
    return encode_record(
        topic=topic,
        queue_id=1,
        body=body,
        properties=PROPS,
        physical_offset=physical_offset,
        record_crc=record_crc,
    )


def put_i32(raw: bytes, pos: int, value: int) -> bytes:
    out = bytearray(raw)
    struct.pack_into(">i", out, pos, value)
    return bytes(out)


def body_len_pos() -> int:
    return 84


def topic_len_pos(raw: bytes) -> int:
    (body_len,) = struct.unpack_from(">i", raw, 84)
    return 88 + int(body_len)


def props_len_pos(raw: bytes) -> int:
    return topic_len_pos(raw) + 1 + raw[topic_len_pos(raw)]


GOOD = rec()


def test_sanity_the_unmodified_record_passes_every_check() -> None:
    got = read_record(GOOD, 0, len(GOOD), expected_offset=0)
    assert isinstance(got, Record) and got.body == BODY


# -- §5.4 rows --------------------------------------------------------------------------------


@pytest.mark.parametrize("available", [0, 1, 4, 7])
def test_fewer_than_8_bytes_left_is_bad(available: int) -> None:
    got = read_record(GOOD, 0, available)
    assert isinstance(got, Bad) and got.size == -1


def test_fewer_than_8_bytes_left_at_the_end_of_a_region_is_bad() -> None:
    buf = bytes(100) + GOOD[:7]
    assert isinstance(read_record(buf, 100, len(buf)), Bad)


@pytest.mark.parametrize("cut", [8, 20, 88, len(GOOD) // 2, len(GOOD) - 1])
def test_total_size_beyond_the_bytes_left_is_bad_a_half_written_record(cut: int) -> None:
    got = read_record(GOOD, 0, cut)
    assert isinstance(got, Bad)
    assert "does not fit" in got.reason


def test_total_size_beyond_the_end_argument_is_bad_even_if_the_buffer_is_longer() -> None:
    buf = GOOD + bytes(500)
    assert isinstance(read_record(buf, 0, len(GOOD) - 1), Bad)
    assert isinstance(read_record(buf, 0, len(GOOD)), Record)


def test_blank_magic_means_end_of_file_with_its_size() -> None:
    region = encode_blank(4000) + bytes(4000 - 8)
    assert read_record(region, 0, len(region)) == Blank(4000)


@pytest.mark.parametrize("magic_hex", ["00000000", "DAA320A8", "A720A3DA", "FFFFFFFF", "CBD43195"])
def test_unknown_magic_code_is_bad(magic_hex: str) -> None:
    raw = GOOD[:4] + bytes.fromhex(magic_hex) + GOOD[8:]
    got = read_record(raw, 0, len(raw))
    assert isinstance(got, Bad)
    assert "magic" in got.reason


def test_an_all_zero_region_is_bad_not_a_record() -> None:
    assert isinstance(read_record(bytes(4096), 0, 4096), Bad)


@pytest.mark.parametrize("record_crc", [True, False], ids=["record-crc", "body-crc-only"])
def test_body_crc_mismatch_is_bad_but_keeps_the_decoded_fields(record_crc: bool) -> None:
    raw = bytearray(rec(record_crc=record_crc))
    raw[88] ^= 0x01  # first body byte
    got = read_record(bytes(raw), 0, len(raw))
    assert isinstance(got, Bad)
    assert got.reason == (RECORD_CRC_MISMATCH if record_crc else BODY_CRC_MISMATCH)
    assert got.size == len(raw)
    assert got.record is not None and got.record.topic == "Topic"


@pytest.mark.parametrize("record_crc", [True, False], ids=["record-crc", "body-crc-only"])
def test_a_crc_mismatch_passes_when_the_crc_check_is_off_as_dispatch_reads(
    record_crc: bool,
) -> None:
    raw = bytearray(rec(record_crc=record_crc))
    raw[88] ^= 0x01
    assert isinstance(read_record(bytes(raw), 0, len(raw), check_crc=False), Record)


@pytest.mark.parametrize("record_crc", [True, False], ids=["record-crc", "body-crc-only"])
def test_stored_crc_mismatch_is_bad(record_crc: bool) -> None:
    good = rec(record_crc=record_crc)
    raw = put_i32(good, 8, struct.unpack_from(">i", good, 8)[0] ^ 0x10)
    assert isinstance(read_record(raw, 0, len(raw)), Bad)


def test_an_empty_body_skips_the_body_crc_check_as_rocketmq_does() -> None:
    # checkMessageAndReturnSize recomputes the body CRC only when bodyLen > 0.
    raw = put_i32(rec(body=b"", record_crc=False), 8, 12345)
    got = read_record(raw, 0, len(raw))
    assert isinstance(got, Record) and got.body == b"" and got.body_crc == 12345


def test_the_record_crc_covers_a_record_with_an_empty_body_too() -> None:
    raw = put_i32(rec(body=b""), 8, 12345)
    got = read_record(raw, 0, len(raw))
    assert isinstance(got, Bad) and got.reason == RECORD_CRC_MISMATCH


# -- the whole-record CRC (record.py) -------------------------------------------------------


def test_a_record_ends_with_rocketmqs_crc_property_over_every_byte_before_it() -> None:
    """CommitLog.CRC32_RESERVED_LEN = 20: "__CRC32#", 0x01, ten digits least significant
    first (MessageDecoder.createCrc32), 0x02; the CRC is crc32 & 0x7FFFFFFF of [0, size - 20),
    computed here with zlib, not with mqstore's code."""
    plain = rec(record_crc=False)
    raw = GOOD
    assert len(raw) == len(plain) + 20
    crc = zlib.crc32(raw[:-20]) & 0x7FFFFFFF
    digits = "".join(str(crc // 10**i % 10) for i in range(10)).encode()
    assert raw[-20:] == b"__CRC32#\x01" + digits + b"\x02"
    # Everything before the property is the plain record's, its lengths 20 more.
    at = props_len_pos(raw)
    assert struct.unpack_from(">i", raw, 0)[0] == len(raw)
    assert raw[4:at] == plain[4:at]
    assert struct.unpack_from(">h", raw, at)[0] == len(PROPS) + 20
    assert raw[at + 2 : -20] == PROPS


def test_the_crc_digits_are_written_least_significant_first() -> None:
    assert record_crc_property(12345) == b"__CRC32#\x015432100000\x02"
    assert record_crc_property(0) == b"__CRC32#\x010000000000\x02"
    assert record_crc_property(2**31 - 1) == b"__CRC32#\x017463847412\x02"


@pytest.mark.parametrize("at", range(len(GOOD)))
def test_a_changed_byte_anywhere_in_a_record_with_the_crc_is_bad(at: int) -> None:
    for change in (0x01, 0x80, 0xFF):
        raw = bytearray(GOOD)
        raw[at] ^= change
        got = read_record(bytes(raw), 0, len(raw), expected_offset=0)
        assert isinstance(got, Bad), (at, change)


@pytest.mark.parametrize(
    ("at", "value"),
    [(-20, ord("-")), (-13, ord("!")), (-12, 0x03), (-11, ord("x")), (-2, ord(":"))],
    ids=["key", "key-end", "separator", "first-digit", "last-digit"],
)
def test_a_damaged_crc_property_is_damage_not_a_record_without_the_crc(at: int, value: int) -> None:
    raw = bytearray(GOOD)
    raw[len(raw) + at] = value
    got = read_record(bytes(raw), 0, len(raw))
    assert isinstance(got, Bad) and got.reason == RECORD_CRC_DAMAGED
    assert stored_record_crc(raw, len(raw), 20) == DAMAGED_RECORD_CRC


def test_a_last_property_that_only_resembles_the_crc_property_is_not_one() -> None:
    """A record without the CRC whose last pair has a 10-byte value under a key two bytes off
    __CRC32# reads with its body CRC (RocketMQ's records: any property is allowed)."""
    props = b"KEYS\x01k\x02_xCRC3x#\x011234567890\x02"
    raw = encode_record(topic="T", queue_id=0, body=BODY, properties=props, record_crc=False)
    got = read_record(raw, 0, len(raw))
    assert isinstance(got, Record) and got.properties == props
    assert got.record_crc == NO_RECORD_CRC


def test_a_record_with_the_crc_decodes_to_the_producers_properties_and_the_crc() -> None:
    got = read_record(GOOD, 0, len(GOOD))
    assert isinstance(got, Record)
    assert got.properties == PROPS and got.properties_dict() == {"TAGS": "T"}
    assert GOOD.endswith(record_crc_property(got.record_crc))
    plain = read_record(rec(record_crc=False), 0, len(GOOD) - 20)
    assert isinstance(plain, Record)
    assert plain.properties == PROPS and plain.record_crc == NO_RECORD_CRC


def test_the_crc_property_counts_against_the_properties_limit() -> None:
    assert prep(properties=b"p" * 32_746 + b"\x02", record_crc=True) == 91 + 1 + 1 + 32_767
    with pytest.raises(PropertiesTooLarge) as exc:
        prep(properties=b"p" * 32_747 + b"\x02", record_crc=True)
    assert "32747-byte limit" in str(exc.value)


def test_total_size_larger_than_the_fields_add_up_to_is_bad() -> None:
    raw = put_i32(GOOD, 0, len(GOOD) + 1) + b"\x00"
    got = read_record(raw, 0, len(raw))
    assert isinstance(got, Bad)
    assert "add up" in got.reason
    assert got.size == len(GOOD) + 1


def test_total_size_smaller_than_the_fields_add_up_to_is_bad() -> None:
    raw = put_i32(GOOD, 0, len(GOOD) - 1)
    got = read_record(raw, 0, len(raw))
    assert isinstance(got, Bad)


def test_a_topic_length_that_disagrees_with_total_size_is_bad() -> None:
    raw = bytearray(GOOD)
    raw[topic_len_pos(GOOD)] -= 1  # one byte of the topic now reads as properties length
    assert isinstance(read_record(bytes(raw), 0, len(raw)), Bad)


@pytest.mark.parametrize("value", [-1, -(2**31), 2**31 - 1])
def test_a_negative_or_huge_body_length_is_bad(value: int) -> None:
    raw = put_i32(GOOD, body_len_pos(), value)
    got = read_record(raw, 0, len(raw))
    assert isinstance(got, Bad)


@pytest.mark.parametrize("value", [-1, -32768])
def test_a_negative_properties_length_is_bad(value: int) -> None:
    raw = bytearray(GOOD)
    struct.pack_into(">h", raw, props_len_pos(GOOD), value)
    got = read_record(bytes(raw), 0, len(raw))
    assert isinstance(got, Bad)


def test_a_negative_v2_topic_length_is_bad() -> None:
    topic = "%RETRY%" + "x" * 130
    raw = bytearray(rec(topic=topic))
    struct.pack_into(">h", raw, 88 + len(BODY), -5)
    got = read_record(bytes(raw), 0, len(raw))
    assert isinstance(got, Bad)


@pytest.mark.parametrize("value", [-1, 0, 90, -(2**31)])
def test_a_negative_or_too_small_total_size_is_bad(value: int) -> None:
    raw = put_i32(GOOD, 0, value)
    got = read_record(raw, 0, len(raw))
    assert isinstance(got, Bad)


def test_ipv6_sysflag_on_ipv4_bytes_is_bad_not_misread() -> None:
    # A flipped SYSFLAG bit makes the hosts 20 bytes: the lengths no longer add up.
    raw = put_i32(GOOD, 36, 0x10)
    assert isinstance(read_record(raw, 0, len(raw)), Bad)


def test_physical_offset_field_must_match_the_expected_offset() -> None:
    raw = rec(physical_offset=4096)
    assert isinstance(read_record(raw, 0, len(raw), expected_offset=4096), Record)
    got = read_record(raw, 0, len(raw), expected_offset=4097)
    assert isinstance(got, Bad)
    assert "physical offset" in got.reason
    assert got.record is not None and got.record.physical_offset == 4096
    # Without an expected offset the field is not checked.
    assert isinstance(read_record(raw, 0, len(raw)), Record)


def test_a_topic_that_is_not_utf8_is_bad() -> None:
    raw = bytearray(GOOD)
    raw[topic_len_pos(GOOD) + 1] = 0xFF
    got = read_record(bytes(raw), 0, len(raw))
    assert isinstance(got, Bad)


def _as_mmap(raw: bytes) -> mmap.mmap:
    m = mmap.mmap(-1, len(raw))
    m[:] = raw
    return m


@pytest.mark.parametrize(
    "wrap",
    [bytes, bytearray, memoryview, _as_mmap],
    ids=["bytes", "bytearray", "memoryview", "mmap"],
)
def test_read_record_reads_every_buffer_type_alike(wrap: Callable[[bytes], Buffer]) -> None:
    buf = wrap(GOOD + encode_blank(100))
    got = read_record(buf, 0, len(GOOD) + 8)
    assert isinstance(got, Record) and got.body == BODY
    assert read_record(buf, len(GOOD), len(GOOD) + 8) == Blank(100)
    if isinstance(buf, mmap.mmap):
        buf.close()


# -- find_next_record -------------------------------------------------------------------------


def test_find_next_record_finds_the_record_after_garbage() -> None:
    base = 1 << 20
    garbage = bytes(range(37))
    buf = garbage + rec(physical_offset=base + 37)
    assert find_next_record(buf, 0, len(buf), base) == 37


def test_find_next_record_finds_a_v2_record_after_garbage() -> None:
    topic = "%DLQ%" + "q" * 140
    buf = b"\xab" * 11 + rec(physical_offset=11, topic=topic)
    assert find_next_record(buf, 0, len(buf), 0) == 11


def test_find_next_record_looks_strictly_after_start() -> None:
    first = rec(physical_offset=0)
    buf = first + rec(physical_offset=len(first))
    assert find_next_record(buf, 0, len(buf), 0) == len(first)


def test_find_next_record_ignores_a_shifted_copy_whose_offset_field_is_elsewhere() -> None:
    # A copy of the record that belongs at offset 0, found at 50: stale bytes, not a record.
    copy = rec(physical_offset=0)
    buf = bytes(50) + copy
    assert find_next_record(buf, 0, len(buf), 0) == -1
    # The same bytes with a true record after them: that one is found.
    true = rec(physical_offset=len(buf))
    assert find_next_record(buf + true, 0, len(buf) + len(true), 0) == len(buf)


def test_find_next_record_skips_a_magic_code_with_a_bad_crc_behind_it() -> None:
    broken = bytearray(rec(physical_offset=20))
    broken[88] ^= 0xFF
    good_at = 20 + len(broken)
    buf = bytes(20) + bytes(broken) + rec(physical_offset=good_at)
    assert find_next_record(buf, 0, len(buf), 0) == good_at


def test_find_next_record_skips_a_lone_magic_code_in_a_body() -> None:
    body = b"xx" + struct.pack(">i", MAGIC_V1) * 3 + b"yy"
    first = rec(physical_offset=0, body=body)
    buf = first + rec(physical_offset=len(first))
    assert find_next_record(buf, 0, len(buf), 0) == len(first)


def test_find_next_record_returns_minus_one_when_nothing_valid_follows() -> None:
    assert find_next_record(bytes(4096), 0, 4096, 0) == -1
    assert find_next_record(bytes(range(256)) * 8, 0, 2048, 0) == -1
    torn = rec(physical_offset=10)
    buf = bytes(10) + torn[:-1]
    assert find_next_record(buf, 0, len(buf), 0) == -1


def test_find_next_record_respects_end() -> None:
    buf = bytes(10) + rec(physical_offset=10)
    assert find_next_record(buf, 0, len(buf) - 1, 0) == -1


# -- prepare_message limits (§1.6) --------------------------------------------------------------


def prep(**kw: object) -> int:
    """prepare_message's size of a record (RocketMQ's layout, without the whole-record CRC,
    unless `record_crc=True`)."""
    args: dict[str, object] = {"topic": "T", "queue_id": 0, "body": b"x", "record_crc": False}
    args.update(kw)
    return prepare_message(**args).size  # type: ignore[arg-type]


def test_a_body_of_exactly_4_mib_is_accepted() -> None:
    assert prep(body=bytes(4 * 1024 * 1024)) == 91 + 4 * 1024 * 1024 + 1


def test_a_body_one_byte_over_4_mib_is_message_illegal() -> None:
    with pytest.raises(MessageIllegal) as exc:
        prep(body=bytes(4 * 1024 * 1024 + 1))
    assert exc.value.field == "body"


def test_properties_of_32767_bytes_are_accepted_without_the_record_crc() -> None:
    assert prep(properties=b"p" * 32_766 + b"\x02") == 91 + 1 + 1 + 32_767


def test_properties_that_do_not_end_with_0x02_are_refused() -> None:
    # Recovery tells a torn write by the missing final 0x02, so a store must never hold one.
    with pytest.raises(MessageIllegal) as exc:
        prep(properties=b"KEYS\x01k")
    assert exc.value.field == "properties"


def test_properties_of_32768_bytes_are_properties_too_large() -> None:
    with pytest.raises(PropertiesTooLarge):
        prep(properties=b"p" * 32_768)


def test_properties_too_large_is_distinct_from_message_illegal() -> None:
    # The store answers PROPERTIES_SIZE_EXCEEDED, not MESSAGE_ILLEGAL, for this one.
    with pytest.raises(PropertiesTooLarge) as exc:
        prep(properties=b"p" * 40_000)
    assert not isinstance(exc.value, MessageIllegal)


def test_a_topic_of_127_bytes_is_accepted_and_128_refused() -> None:
    assert prep(topic="a" * 127) == 91 + 1 + 127
    with pytest.raises(MessageIllegal) as exc:
        prep(topic="a" * 128)
    assert exc.value.field == "topic"


@pytest.mark.parametrize("prefix", ["%RETRY%", "%DLQ%"])
def test_retry_and_dlq_topics_may_reach_255_bytes_written_as_v2(prefix: str) -> None:
    topic = prefix + "g" * (255 - len(prefix))
    assert prep(topic=topic) == 91 + 1 + 1 + 255  # V2: one more byte of topic length
    assert prepare_message(topic=topic, queue_id=0, body=b"x").magic != MAGIC_V1
    short = prefix + "g" * (127 - len(prefix))
    assert prepare_message(topic=short, queue_id=0, body=b"x").magic == MAGIC_V1
    with pytest.raises(MessageIllegal):
        prep(topic=topic + "g")


@pytest.mark.parametrize(
    "topic", ["a/b", "..", "../etc", "a..b", "a#b", "", "a b", "tópico", "a.b", "a\x00"]
)
def test_topics_outside_the_validator_pattern_are_refused(topic: str) -> None:
    with pytest.raises(MessageIllegal):
        prep(topic=topic)


@pytest.mark.parametrize("topic", ["a", "A-z_0|9", "%RETRY%group", "T" * 127])
def test_topics_inside_the_validator_pattern_are_accepted(topic: str) -> None:
    assert prep(topic=topic) > 0


@pytest.mark.parametrize("queue_id", [-1, 65_536, 2**31 - 1])
def test_queue_ids_outside_0_to_65535_are_refused(queue_id: int) -> None:
    with pytest.raises(MessageIllegal) as exc:
        prep(queue_id=queue_id)
    assert exc.value.field == "queue_id"


@pytest.mark.parametrize("queue_id", [0, 65_535])
def test_queue_ids_at_the_bounds_are_accepted(queue_id: int) -> None:
    assert prep(queue_id=queue_id) > 0


def test_a_born_host_that_is_neither_8_nor_20_bytes_is_refused() -> None:
    with pytest.raises(MessageIllegal):
        prep(born_host=b"\x7f\x00\x00\x01\x00\x00")


def test_limits_are_configurable_and_enforced_as_configured() -> None:
    small = MessageLimits(body_bytes_max=10, topic_bytes_max=5, properties_bytes_max=24)
    assert prep(body=b"x" * 10, limits=small) > 0
    with pytest.raises(MessageIllegal):
        prep(body=b"x" * 11, limits=small)
    with pytest.raises(MessageIllegal):
        prep(topic="abcdef", limits=small)
    assert prep(properties=b"1234\x02", limits=small) > 0
    with pytest.raises(PropertiesTooLarge):
        prep(properties=b"1234\x02", limits=small, record_crc=True)  # 5 + 20 of the CRC


@pytest.mark.parametrize("body_bytes", [16, 1024])
def test_checks_of_many_records_give_the_verdicts_of_read_record(body_bytes: int) -> None:
    """check_records, as the Read and cq_svc's local reads call it (no bodies) and as the SDK
    does (bodies): each record's verdict is read_record's, its reason included."""
    raws = [
        rec(physical_offset=1000 + i, body=bytes([i]) * body_bytes + b"%d" % i) for i in range(40)
    ]
    raws[3] = raws[3][:100] + bytes([raws[3][100] ^ 1]) + raws[3][101:]  # body: CRC fails
    raws[7] = put_i32(raws[7], 4, MAGIC_V1 ^ 8)  # magic
    raws[11] = raws[11][:-1] + b"\x03"  # the properties' closing 0x02
    blob = b"".join(raws)
    sizes = [len(r) for r in raws]
    offsets = [1000 + i for i in range(40)]
    offsets[20] += 1  # PHYSICALOFFSET: not where it was read
    lean = check_records(blob, sizes, offsets, bodies=False)
    full = check_records(blob, sizes, offsets)
    alone = [
        read_record(r, 0, len(r), check_crc=True, expected_offset=o)
        for r, o in zip(raws, offsets, strict=True)
    ]
    want = [(i, got.reason) for i, got in enumerate(alone) if isinstance(got, Bad)]
    assert lean.failed == full.failed == want
    assert [i for i, _ in want] == [3, 7, 11, 20]
    assert lean.bodies == [] and len(full.bodies) == 40
