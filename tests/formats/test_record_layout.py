"""Golden bytes of the commit-log record (rocketmq-store.md §1.1-1.4, §1.7).

Every expected byte string here is built by hand, field by field, with struct and literal
values read off the reference; the codec under test is only ever compared against it. The
records are RocketMQ's default layout (no whole-record CRC) unless a test says otherwise; with
it (enabledAppendPropCRC, §1.4) the hand-built record ends in the 20-byte __CRC32# property.
"""

from __future__ import annotations

import ipaddress
import re
import struct
import zlib
from pathlib import Path

import pytest

from mqstore.formats import record, sysflag
from mqstore.formats.properties import encode_properties
from mqstore.formats.record import (
    BLANK_MAGIC,
    MAGIC_V1,
    MAGIC_V2,
    Blank,
    Record,
    body_crc,
    encode_blank,
    encode_record,
    read_record,
    record_length,
)

# The golden message of T/ReputMessageServiceTest: 32-byte body, topic FooBar, TAGS and a
# 13-digit KEYS; ten of them take 1580 bytes, so one takes 158.
BODY = b"golden-body-of-exactly-32-bytes!"
assert len(BODY) == 32
TOPIC = "FooBar"
KEYS_VALUE = "1700000000123"  # 13 digits
PROPS = b"TAGS\x01TAG1\x02KEYS\x011700000000123\x02"
assert len(PROPS) == 29

QUEUE_ID = 3
FLAG = 7
QUEUE_OFFSET = 9
PHYSICAL_OFFSET = 1422  # the tenth record of the test: 9 * 158
BORN_TS = 1_700_000_000_123
STORE_TS = 1_700_000_000_456
RECONSUME = 2
PREPARED_TX = 0

BORN_V4 = ("192.168.0.10", 54321)
STORE_V4 = ("10.0.0.1", 10911)
BORN_V6 = ("2001:db8::10", 54321)
STORE_V6 = ("fe80::1", 10911)


def host_bytes(ip: str, port: int) -> bytes:
    """Address bytes then the port as a big-endian int32, as the record stores a host."""
    return ipaddress.ip_address(ip).packed + struct.pack(">i", port)


def hand_built_record(
    *,
    topic: bytes,
    born: tuple[str, int],
    store: tuple[str, int],
    magic_u32: int,
    sys_flag: int,
    topic_length_format: str,
    record_crc: bool = False,
) -> bytes:
    """The record laid out field by field from the §1.1 table, with no help from the codec;
    `record_crc`: with the whole-record CRC property of §1.4 at its end."""
    born_raw = host_bytes(*born)
    store_raw = host_bytes(*store)
    crc = zlib.crc32(BODY) & 0x7FFFFFFF
    reserved = 20 if record_crc else 0  # CommitLog.CRC32_RESERVED_LEN
    tail = (
        struct.pack(">i", len(BODY))
        + BODY
        + struct.pack(topic_length_format, len(topic))
        + topic
        + struct.pack(">h", len(PROPS) + reserved)
        + PROPS
    )
    middle = (
        struct.pack(">I", magic_u32)  # 2  MAGICCODE, written unsigned to spell the hex
        + struct.pack(">i", crc)  # 3  BODYCRC
        + struct.pack(">i", QUEUE_ID)  # 4  QUEUEID
        + struct.pack(">i", FLAG)  # 5  FLAG
        + struct.pack(">q", QUEUE_OFFSET)  # 6  QUEUEOFFSET
        + struct.pack(">q", PHYSICAL_OFFSET)  # 7  PHYSICALOFFSET
        + struct.pack(">i", sys_flag)  # 8  SYSFLAG
        + struct.pack(">q", BORN_TS)  # 9  BORNTIMESTAMP
        + born_raw  # 10 BORNHOST
        + struct.pack(">q", STORE_TS)  # 11 STORETIMESTAMP
        + store_raw  # 12 STOREHOSTADDRESS
        + struct.pack(">i", RECONSUME)  # 13 RECONSUMETIMES
        + struct.pack(">q", PREPARED_TX)  # 14 PREPARED TRANSACTION OFFSET
        + tail  # 15-17 BODY, TOPIC, PROPERTIES
    )
    record = struct.pack(">i", 4 + len(middle) + reserved) + middle  # 1 TOTALSIZE
    if not record_crc:
        return record
    # MessageDecoder.createCrc32: "__CRC32#", 0x01, the CRC of every byte before it in ten
    # digits, the least significant first, 0x02.
    whole = zlib.crc32(record) & 0x7FFFFFFF
    digits = bytes(ord("0") + whole // 10**i % 10 for i in range(10))
    return record + b"__CRC32#\x01" + digits + b"\x02"


def encode(
    *,
    topic: str = TOPIC,
    born: tuple[str, int] = BORN_V4,
    store: tuple[str, int] = STORE_V4,
    record_crc: bool = False,
) -> bytes:
    return encode_record(
        record_crc=record_crc,
        topic=topic,
        queue_id=QUEUE_ID,
        body=BODY,
        properties=PROPS,
        flag=FLAG,
        queue_offset=QUEUE_OFFSET,
        physical_offset=PHYSICAL_OFFSET,
        born_timestamp_ms=BORN_TS,
        born_host=host_bytes(*born),
        store_timestamp_ms=STORE_TS,
        store_host=host_bytes(*store),
        reconsume_times=RECONSUME,
        prepared_tx_offset=PREPARED_TX,
    )


GOLDEN_V4_V1 = hand_built_record(
    topic=b"FooBar",
    born=BORN_V4,
    store=STORE_V4,
    magic_u32=0xDAA320A7,
    sys_flag=0,
    topic_length_format=">B",
)


def test_golden_record_is_158_bytes_as_in_rocketmqs_reput_test() -> None:
    assert len(GOLDEN_V4_V1) == 158
    assert 10 * len(GOLDEN_V4_V1) == 1580


def test_properties_of_the_golden_record_encode_to_the_29_bytes_rocketmq_writes() -> None:
    assert encode_properties({"TAGS": "TAG1", "KEYS": KEYS_VALUE}) == PROPS


def test_encode_record_produces_the_hand_built_golden_bytes() -> None:
    assert encode() == GOLDEN_V4_V1


GOLDEN_V4_V1_CRC = hand_built_record(
    topic=b"FooBar",
    born=BORN_V4,
    store=STORE_V4,
    magic_u32=0xDAA320A7,
    sys_flag=0,
    topic_length_format=">B",
    record_crc=True,
)


def test_with_the_whole_record_crc_the_golden_record_is_20_bytes_longer() -> None:
    assert len(GOLDEN_V4_V1_CRC) == 178
    assert GOLDEN_V4_V1_CRC[4:127] == GOLDEN_V4_V1[4:127]
    assert struct.unpack_from(">h", GOLDEN_V4_V1_CRC, 127)[0] == 29 + 20
    assert GOLDEN_V4_V1_CRC[129:158] == PROPS
    assert GOLDEN_V4_V1_CRC[158:167] == b"__CRC32#\x01"


def test_encode_record_writes_the_hand_built_whole_record_crc() -> None:
    assert encode(record_crc=True) == GOLDEN_V4_V1_CRC
    got = read_record(GOLDEN_V4_V1_CRC, 0, 178, expected_offset=PHYSICAL_OFFSET)
    assert isinstance(got, Record)
    assert got.properties_dict() == {"TAGS": "TAG1", "KEYS": KEYS_VALUE}


def test_fields_sit_at_the_offsets_the_reference_names() -> None:
    g = GOLDEN_V4_V1
    assert struct.unpack_from(">i", g, 0)[0] == 158  # TOTALSIZE
    assert g[4:8] == bytes.fromhex("DAA320A7")  # MESSAGE_MAGIC_CODE_POSITION = 4
    assert struct.unpack_from(">i", g, 16)[0] == FLAG  # MESSAGE_FLAG_POSITION = 16
    assert struct.unpack_from(">q", g, 20)[0] == QUEUE_OFFSET  # QUEUE_OFFSET_POSITION = 20
    assert struct.unpack_from(">q", g, 28)[0] == PHYSICAL_OFFSET  # PHY_POS_POSITION = 28
    assert struct.unpack_from(">i", g, 36)[0] == 0  # SYSFLAG_POSITION = 36
    assert struct.unpack_from(">q", g, 56)[0] == STORE_TS  # MESSAGE_STORE_TIMESTAMP_POSITION
    assert struct.unpack_from(">i", g, 84)[0] == 32  # BODYLENGTH at 84 (damageCommitLog)
    assert g[88:120] == BODY
    assert g[120] == 6 and g[121:127] == b"FooBar"
    assert struct.unpack_from(">h", g, 127)[0] == 29 and g[129:158] == PROPS


def test_record_pys_header_definition_reads_the_hand_built_golden_record() -> None:
    """The one header definition (record.py's top) names the fields where the reference puts
    them: the prefix struct (TOTALSIZE .. SYSFLAG), the positions, the header sizes."""
    g = GOLDEN_V4_V1
    assert record.RECORD_PREFIX.unpack_from(g) == (
        158,
        MAGIC_V1,
        zlib.crc32(BODY) & 0x7FFFFFFF,
        QUEUE_ID,
        FLAG,
        QUEUE_OFFSET,
        PHYSICAL_OFFSET,
        0,
    )
    assert record.RECORD_PREFIX_BYTES == 40 == record.SYSFLAG_POS + 4
    assert record.SIZE_MAGIC.unpack_from(g) == (158, MAGIC_V1)
    for pos, fmt, want in [
        (record.MAGIC_POS, ">i", MAGIC_V1),
        (record.QUEUE_ID_POS, ">i", QUEUE_ID),
        (record.QUEUE_OFFSET_POS, ">q", QUEUE_OFFSET),
        (record.PHYSICAL_OFFSET_POS, ">q", PHYSICAL_OFFSET),
        (record.SYSFLAG_POS, ">i", 0),
    ]:
        assert struct.unpack_from(fmt, g, pos)[0] == want
    assert g[record.BORN_HOST_POS : record.BORN_HOST_POS + 8] == host_bytes(*BORN_V4)
    assert record.RECORD_BYTES_MIN == 91 == 158 - len(BODY) - len(TOPIC) - len(PROPS)
    born, store = record.IPV6_HOST_BYTES, record.IPV6_HOST_BYTES
    assert record.HEADERS[(born, store)].size == 88 + 2 * record.V6_EXTRA_BYTES


def test_read_record_decodes_every_field_of_the_golden_record() -> None:
    got = read_record(GOLDEN_V4_V1, 0, len(GOLDEN_V4_V1), expected_offset=PHYSICAL_OFFSET)
    assert isinstance(got, Record)
    assert got.total_size == 158
    assert got.magic == MAGIC_V1 and not got.v2
    assert got.body_crc == zlib.crc32(BODY) & 0x7FFFFFFF
    assert got.queue_id == QUEUE_ID
    assert got.flag == FLAG
    assert got.queue_offset == QUEUE_OFFSET
    assert got.physical_offset == PHYSICAL_OFFSET
    assert got.sys_flag == 0
    assert got.born_timestamp_ms == BORN_TS
    assert got.born_host == host_bytes(*BORN_V4)
    assert got.store_timestamp_ms == STORE_TS
    assert got.store_host == host_bytes(*STORE_V4)
    assert got.reconsume_times == RECONSUME
    assert got.prepared_tx_offset == PREPARED_TX
    assert got.body == BODY
    assert got.topic == TOPIC
    assert got.properties == PROPS
    assert got.properties_dict() == {"TAGS": "TAG1", "KEYS": KEYS_VALUE}


def test_the_golden_record_decodes_at_any_position_of_a_larger_buffer() -> None:
    buf = bytearray(b"\xee" * 100) + GOLDEN_V4_V1 + b"\xee" * 50
    got = read_record(memoryview(buf), 100, 100 + 158)
    assert isinstance(got, Record) and got.body == BODY and got.total_size == 158


@pytest.mark.parametrize(
    ("born", "store", "flags", "extra"),
    [
        (BORN_V6, STORE_V4, sysflag.BORNHOST_V6, 12),
        (BORN_V4, STORE_V6, sysflag.STOREHOST_V6, 12),
        (BORN_V6, STORE_V6, sysflag.BORNHOST_V6 | sysflag.STOREHOST_V6, 24),
    ],
    ids=["born-v6", "store-v6", "both-v6"],
)
def test_each_ipv6_host_adds_12_bytes_and_sets_its_sysflag_bit(
    born: tuple[str, int], store: tuple[str, int], flags: int, extra: int
) -> None:
    expected = hand_built_record(
        topic=b"FooBar",
        born=born,
        store=store,
        magic_u32=0xDAA320A7,
        sys_flag=flags,
        topic_length_format=">B",
    )
    assert len(expected) == 158 + extra
    encoded = encode(born=born, store=store)
    assert encoded == expected
    with_crc = hand_built_record(
        topic=b"FooBar",
        born=born,
        store=store,
        magic_u32=0xDAA320A7,
        sys_flag=flags,
        topic_length_format=">B",
        record_crc=True,
    )
    assert encode(born=born, store=store, record_crc=True) == with_crc
    got = read_record(encoded, 0, len(encoded))
    assert isinstance(got, Record)
    assert got.sys_flag == flags
    assert got.born_host == host_bytes(*born) and got.store_host == host_bytes(*store)
    assert got.store_timestamp_ms == STORE_TS
    # CommitLog.pickupStoreTimestamp: the store time moves with the born host's size.
    pos = 68 if flags & sysflag.BORNHOST_V6 else 56
    assert struct.unpack_from(">q", encoded, pos)[0] == STORE_TS


def test_v2_magic_and_a_two_byte_topic_length_for_topics_over_127_chars() -> None:
    topic = "%RETRY%" + "g" * 133  # 140 chars: only retry/DLQ topics may be this long
    expected = hand_built_record(
        topic=topic.encode(),
        born=BORN_V4,
        store=STORE_V4,
        magic_u32=0xDAA320AB,
        sys_flag=0,
        topic_length_format=">h",
    )
    # V2 costs one byte over the V1 overhead of 91: the topic length takes 2 bytes.
    assert len(expected) == 91 + 1 + len(BODY) + len(topic) + len(PROPS)
    assert record_length(len(BODY), len(topic), len(PROPS), v2=True) == len(expected)
    encoded = encode(topic=topic)
    assert encoded == expected
    with_crc = hand_built_record(
        topic=topic.encode(),
        born=BORN_V4,
        store=STORE_V4,
        magic_u32=0xDAA320AB,
        sys_flag=0,
        topic_length_format=">h",
        record_crc=True,
    )
    assert encode(topic=topic, record_crc=True) == with_crc
    got = read_record(encoded, 0, len(encoded))
    assert isinstance(got, Record)
    assert got.v2 and got.magic == MAGIC_V2
    assert got.topic == topic


def test_a_127_char_topic_still_uses_v1() -> None:
    topic = "t" * 127
    encoded = encode(topic=topic)
    assert encoded[4:8] == bytes.fromhex("DAA320A7")
    assert encoded[120] == 127
    assert len(encoded) == 91 + 32 + 127 + 29


def test_sysflag_v6_bits_follow_the_hosts_not_the_callers_flag() -> None:
    # A caller claiming IPv6 hosts with IPv4 bytes must not produce an unreadable record.
    encoded = encode_record(
        topic=TOPIC,
        queue_id=0,
        body=BODY,
        sys_flag=sysflag.BORNHOST_V6 | sysflag.STOREHOST_V6 | sysflag.MULTI_TAGS,
    )
    got = read_record(encoded, 0, len(encoded))
    assert isinstance(got, Record)
    assert got.sys_flag == sysflag.MULTI_TAGS


def test_magic_codes_are_rocketmqs_values_read_as_signed_int32() -> None:
    def signed(hex_code: str) -> int:
        return int(struct.unpack(">i", bytes.fromhex(hex_code))[0])

    assert MAGIC_V1 == signed("DAA320A7") == -626843481
    assert MAGIC_V2 == signed("DAA320AB") == -626843477
    assert BLANK_MAGIC == signed("CBD43194") == -875286124


def test_end_of_file_blank_is_8_bytes_remaining_size_then_blank_magic() -> None:
    blank = encode_blank(3_000)
    assert blank == struct.pack(">i", 3_000) + bytes.fromhex("CBD43194")
    assert len(blank) == 8
    # Readers see "the rest of this file is empty", with the size the writer put there.
    assert read_record(blank, 0, 8) == Blank(3_000)
    region = blank + bytes(3_000 - 8)
    assert read_record(region, 0, len(region)) == Blank(3_000)


def test_body_crc_is_crc32_ieee_with_the_top_bit_cleared() -> None:
    # The CRC-32/IEEE check value of "123456789" is 0xCBF43926; the mask clears its top bit.
    assert body_crc(b"123456789") == 0xCBF43926 & 0x7FFFFFFF == 0x4BF43926
    assert body_crc(b"") == 0
    assert body_crc(BODY) == zlib.crc32(BODY) & 0x7FFFFFFF
    assert all(body_crc(bytes([b]) * 7) >= 0 for b in range(256))


def test_no_module_but_record_py_defines_the_record_header() -> None:
    """The duplicate header definitions stay deleted: the prefix struct and the magic codes
    are spelled in record.py alone (the compiled core's C copy is pinned in test_record_walk)."""
    root = Path(__file__).resolve().parents[2]
    spelled = re.compile(r"iiiii|DAA320A|CBD43194|-626843|-875286")
    found = [
        str(path.relative_to(root))
        for pkg in ("mqstore", "commitlog_svc", "cq_svc", "index_svc")
        for path in sorted((root / pkg).rglob("*.py"))
        if spelled.search(path.read_text(encoding="utf-8"))
    ]
    assert found == ["mqstore/formats/record.py"]
