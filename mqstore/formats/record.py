"""Commit-log record: one message as RocketMQ lays it out, big-endian.

    off  size  field
    0    4     TOTALSIZE             whole record, this field included
    4    4     MAGICCODE             0xDAA320A7 (V1: 1-byte topic length) | 0xDAA320AB (V2: 2-byte)
    8    4     BODYCRC               crc32(body) & 0x7FFFFFFF  (zlib's CRC-32, formats/crc.py)
    12   4     QUEUEID
    16   4     FLAG                  the producer's flag
    20   8     QUEUEOFFSET           index in the consume queue (0 for PREPARED/ROLLBACK)
    28   8     PHYSICALOFFSET        commit-log offset of this record
    36   4     SYSFLAG               bits in sysflag.py; 0x10 / 0x20 make a host 20 bytes
    40   8     BORNTIMESTAMP         producer time, ms
    48   8|20  BORNHOST              IPv4 (4) + port (int32) | IPv6 (16) + port
    56   8     STORETIMESTAMP        store time, ms (offsets shift by 12 after an IPv6 born host)
    64   8|20  STOREHOST             IPv4 + port | IPv6 + port
    72   4     RECONSUMETIMES
    76   8     PREPARED TX OFFSET
    84   4+n   BODYLENGTH, BODY
    ..   1+t   TOPICLENGTH, TOPIC     2+t with V2
    ..   2+p   PROPERTIESLENGTH, PROPERTIES   (properties.py)

    IPv4/IPv4/V1 overhead: 91 bytes. The 158-byte golden record: 91 + body 32 + topic 6 + props 29.

The whole-record CRC (RocketMQ's enabledAppendPropCRC; mqstore writes it by default). The last
20 bytes of PROPERTIES (counted in PROPERTIESLENGTH, after the producer's pairs) are one more
property, MessageConst.PROPERTY_CRC32 (CommitLog.CRC32_RESERVED_LEN = 20):

    __CRC32#   0x01   d0 d1 d2 d3 d4 d5 d6 d7 d8 d9   0x02
    key (8)           ten ASCII digits, the least significant first, zero-padded on the right:
                      MessageDecoder.createCrc32 (CRC 12345 -> "5432100000")

    CRC = crc32 & 0x7FFFFFFF (as BODYCRC) of the record's bytes [0, TOTALSIZE - 20): every field
    above, the properties length and the pairs before the property, written after the store
    filled in the queue offset, the physical offset and the store time.

A reader finds the property by position (the record's last 20 bytes, as RocketMQ's reader skips
exactly that many when it computes the CRC). A record that carries it is checked by it alone: it
covers the body and BODYCRC as written (RocketMQ's forceVerifyPropCRC replaces the body check
the same way). A record without it (written before mqstore had it, or by RocketMQ with the
option off) is checked by BODYCRC alone. Properties whose last 20 bytes keep 9 of the 10 fixed
bytes of the property (key, 0x01, 0x02) but are not a well-formed one are damage, not a record
without the CRC. The key is reserved: producers may not send it.

End of file: when a record (plus 8) does not fit in what is left of a segment, the writer puts
an 8-byte blank, TOTALSIZE = bytes left in the file and MAGIC = 0xCBD43194, and moves to the
next file. Readers treat the blank as "continue at the next file".

Written by commitlog_svc; read by recovery, reads, dispatch, `mqstore log`, and the Spark file
reader. Pure functions: no I/O. `buf` may be bytes, bytearray, mmap or memoryview.
"""

from __future__ import annotations

import ipaddress
import mmap
import operator
import struct
from dataclasses import dataclass
from typing import Final, NamedTuple, TypeAlias

from mqstore.errors import MessageIllegal, PropertiesTooLarge
from mqstore.formats import sysflag
from mqstore.formats.crc import crc32
from mqstore.formats.properties import RECORD_CRC, decode_properties
from mqstore.limits import TOPIC_PATTERN, MessageLimits, is_system_topic

# What the codec reads from and writes into: bytes for tests, an mmap or a bytearray for files.
Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap
WritableBuffer: TypeAlias = bytearray | memoryview | mmap.mmap

# ---------------------------------------------------------------------------------------------
# The record header: the one definition of the layout drawn above. Every Python module takes
# these names from here; the compiled core (_core.pyx) has its own C copy, pinned to these by
# tests/formats/test_record_walk.py.

MAGIC_V1: Final = -626843481  # 0xDAA320A7
MAGIC_V2: Final = -626843477  # 0xDAA320AB
BLANK_MAGIC: Final = -875286124  # 0xCBD43194
END_FILE_MIN_BLANK_BYTES: Final = 8

# The 40-byte prefix, TOTALSIZE .. SYSFLAG: the fields that sit at the same place in every
# record, whatever its host sizes.
RECORD_PREFIX: Final = struct.Struct(">iiiiiqqi")
RECORD_PREFIX_BYTES: Final = 40
assert RECORD_PREFIX.size == RECORD_PREFIX_BYTES
# TOTALSIZE and MAGICCODE: what a record and an end-of-file blank share.
SIZE_MAGIC: Final = struct.Struct(">ii")

# Positions of the fields that do not move with host sizes (the prefix's, and BORNHOST).
MAGIC_POS: Final = 4
QUEUE_ID_POS: Final = 12
QUEUE_OFFSET_POS: Final = 20
PHYSICAL_OFFSET_POS: Final = 28
SYSFLAG_POS: Final = 36
BORN_HOST_POS: Final = 48

IPV4_HOST_BYTES: Final = 8
IPV6_HOST_BYTES: Final = 20
# What an IPv6 born or store host adds to the IPv4/IPv4 header.
V6_EXTRA_BYTES: Final = IPV6_HOST_BYTES - IPV4_HOST_BYTES


def _header(born_host_bytes: int, store_host_bytes: int) -> struct.Struct:
    # TOTALSIZE .. BODYLENGTH, everything before the body: the prefix, BORNTIMESTAMP, BORNHOST,
    # STORETIMESTAMP, STOREHOST, RECONSUMETIMES, PREPARED TX OFFSET, BODYLENGTH.
    return struct.Struct(f"{RECORD_PREFIX.format}q{born_host_bytes}sq{store_host_bytes}siqi")


HEADERS: dict[tuple[int, int], struct.Struct] = {
    (b, s): _header(b, s)
    for b in (IPV4_HOST_BYTES, IPV6_HOST_BYTES)
    for s in (IPV4_HOST_BYTES, IPV6_HOST_BYTES)
}
HEADER_V4_V4: Final = HEADERS[(IPV4_HOST_BYTES, IPV4_HOST_BYTES)]
assert HEADER_V4_V4.size == 88  # 91 bytes of overhead minus topic length (1) and props length (2)
# The smallest whole record: the IPv4/IPv4 header, a topic length byte, a properties length.
RECORD_BYTES_MIN: Final = HEADER_V4_V4.size + 3

# The whole encoded record may exceed the body limit by this much (headers, topic, properties).
RECORD_OVERHEAD_BYTES_MAX: Final = 64 * 1024

_I32 = struct.Struct(">i")
_TOPIC_LEN_V1 = struct.Struct(">B")
_TOPIC_LEN_V2 = struct.Struct(">h")
_PROPS_LEN = struct.Struct(">h")
# Serialised properties end with this byte (properties.py): every key/value pair does.
PROPERTIES_END_BYTE: Final = 0x02

# The whole-record CRC property (see the top).
RECORD_CRC_HEAD: Final = RECORD_CRC.encode("ascii") + b"\x01"
RECORD_CRC_DIGITS: Final = 10  # a CRC with the top bit cleared is below 2**31: ten digits
RECORD_CRC_BYTES: Final = len(RECORD_CRC_HEAD) + RECORD_CRC_DIGITS + 1  # CRC32_RESERVED_LEN
assert RECORD_CRC_BYTES == 20
# What an encoder lays down before the CRC is known; the digits are then written over it.
RECORD_CRC_PLACEHOLDER: Final = RECORD_CRC_HEAD + b"0" * RECORD_CRC_DIGITS + b"\x02"
# Properties ending in 20 bytes that keep at least this many of the property's 10 fixed bytes
# claim the CRC: one damaged byte in the property is then damage, not a record without the CRC
# (which would need its last pair to be an 8-byte key one byte off __CRC32# with a 10-byte
# value: never by chance).
RECORD_CRC_FIXED_BYTES_KEPT_MIN: Final = 9
# stored_record_crc's answers that are not a CRC.
NO_RECORD_CRC: Final = -1
DAMAGED_RECORD_CRC: Final = -2
_CRC_MASK: Final = 0x7FFFFFFF


def host_bytes_for_flag(sys_flag: int) -> tuple[int, int]:
    born = IPV6_HOST_BYTES if sys_flag & sysflag.BORNHOST_V6 else IPV4_HOST_BYTES
    store = IPV6_HOST_BYTES if sys_flag & sysflag.STOREHOST_V6 else IPV4_HOST_BYTES
    return born, store


def body_crc(body: Buffer) -> int:
    """RocketMQ's body CRC: CRC-32/IEEE with the top bit cleared."""
    return crc32(body) & _CRC_MASK


def record_crc(buf: Buffer, pos: int, total_size: int) -> int:
    """The whole-record CRC of the record at `pos`: its bytes but the last 20 (the property
    holding the CRC), CRC-32/IEEE with the top bit cleared."""
    with memoryview(buf) as view:
        return crc32(view[pos : pos + total_size - RECORD_CRC_BYTES]) & _CRC_MASK


def record_crc_property(crc: int) -> bytes:
    """The 20 bytes of the property holding `crc`, as MessageDecoder.createCrc32 writes them."""
    return RECORD_CRC_HEAD + (b"%010d" % crc)[::-1] + b"\x02"


def stored_record_crc(buf: Buffer, record_end: int, props_len: int) -> int:
    """What the record ending at `record_end`, whose properties are `props_len` bytes, holds of
    the whole-record CRC: the CRC (>= 0); NO_RECORD_CRC when its properties do not end with the
    property (a record written without it); DAMAGED_RECORD_CRC when they end with what is
    recognisably the property but not a well-formed one."""
    if props_len < RECORD_CRC_BYTES:
        return NO_RECORD_CRC
    tail = bytes(buf[record_end - RECORD_CRC_BYTES : record_end])
    head = len(RECORD_CRC_HEAD)
    digits = tail[head:-1]
    if tail[:head] == RECORD_CRC_HEAD and tail[-1] == PROPERTIES_END_BYTE and digits.isdigit():
        return int(digits[::-1])
    kept = sum(map(operator.eq, tail[:head], RECORD_CRC_HEAD)) + (tail[-1] == PROPERTIES_END_BYTE)
    return DAMAGED_RECORD_CRC if kept >= RECORD_CRC_FIXED_BYTES_KEPT_MIN else NO_RECORD_CRC


def record_length(
    body_bytes: int,
    topic_bytes: int,
    properties_bytes: int,
    *,
    born_host_bytes: int = IPV4_HOST_BYTES,
    store_host_bytes: int = IPV4_HOST_BYTES,
    v2: bool = False,
) -> int:
    """`calMsgLength`: the TOTALSIZE a record with these parts must have."""
    return (
        4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8
        + born_host_bytes
        + 8
        + store_host_bytes
        + 4 + 8
        + 4 + body_bytes
        + (2 if v2 else 1) + topic_bytes
        + 2 + properties_bytes
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Hosts


def pack_host(ip: str, port: int) -> bytes:
    """An address as the record stores it: IPv4 (4) or IPv6 (16) bytes, then the port as int32."""
    addr = ipaddress.ip_address(ip)
    return addr.packed + _I32.pack(port)


def unpack_host(raw: Buffer) -> tuple[str, int]:
    raw = bytes(raw)
    (port,) = _I32.unpack_from(raw, len(raw) - 4)
    return str(ipaddress.ip_address(raw[:-4])), port


# ---------------------------------------------------------------------------------------------
# Encoding


@dataclass(slots=True)
class PreparedMessage:
    """A message checked against the limits, with everything the store does not assign
    already computed, so that the write under the lock is one pack and two copies."""

    size: int
    header: struct.Struct
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: bytes
    reconsume_times: int
    prepared_tx_offset: int
    body: Buffer
    tail: bytes  # topic length, topic, properties length, properties (+ the CRC placeholder)
    topic: str
    gets_queue_offset: bool
    record_crc: bool  # the record ends with the whole-record CRC property


def prepare_message(
    *,
    topic: str,
    queue_id: int,
    body: Buffer,
    properties: bytes = b"",
    flag: int = 0,
    sys_flag: int = 0,
    born_timestamp_ms: int = 0,
    born_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x00\x00",
    reconsume_times: int = 0,
    prepared_tx_offset: int = 0,
    store_host_v6: bool = False,
    limits: MessageLimits = MessageLimits(),  # noqa: B008 - frozen, shared default
    record_crc: bool = True,
) -> PreparedMessage:
    """Check one message against the limits and precompute its record parts. `record_crc`:
    end the record with the whole-record CRC property (its 20 bytes count against the
    properties limit, as RocketMQ counts its reserve).

    Raises MessageIllegal or PropertiesTooLarge; a refused message consumes nothing.
    """
    body_len = len(body)
    if body_len > limits.body_bytes_max:
        raise MessageIllegal(
            f"body is {body_len} bytes, over the {limits.body_bytes_max}-byte limit", field="body"
        )
    topic_raw = validate_topic(topic, limits)
    if not 0 <= queue_id <= limits.queue_id_max:
        raise MessageIllegal(
            f"queue id {queue_id} outside [0, {limits.queue_id_max}]", field="queue_id"
        )
    props_len = len(properties)
    reserved = RECORD_CRC_BYTES if record_crc else 0
    if props_len + reserved > limits.properties_bytes_max:
        raise properties_too_large(props_len, limits, reserved)
    if props_len and properties[-1] != PROPERTIES_END_BYTE:
        raise MessageIllegal(
            "properties must be empty or end with 0x02 (encode them with encode_properties)",
            field="properties",
        )
    if len(born_host) not in (IPV4_HOST_BYTES, IPV6_HOST_BYTES):
        raise MessageIllegal("born host must be 8 (IPv4) or 20 (IPv6) bytes", field="born_host")
    # The V6 bits follow the hosts, whatever the caller passed.
    sys_flag &= ~(sysflag.BORNHOST_V6 | sysflag.STOREHOST_V6)
    if len(born_host) == IPV6_HOST_BYTES:
        sys_flag |= sysflag.BORNHOST_V6
    if store_host_v6:
        sys_flag |= sysflag.STOREHOST_V6
    v2 = len(topic) > 127  # RocketMQ's autoMessageVersionOnTopicLen counts characters
    born_bytes, store_bytes = host_bytes_for_flag(sys_flag)
    size = record_length(
        body_len,
        len(topic_raw),
        props_len + reserved,
        born_host_bytes=born_bytes,
        store_host_bytes=store_bytes,
        v2=v2,
    )
    if size > limits.body_bytes_max + RECORD_OVERHEAD_BYTES_MAX:
        raise MessageIllegal(f"encoded record of {size} bytes is too large", field="body")
    topic_len = (_TOPIC_LEN_V2 if v2 else _TOPIC_LEN_V1).pack(len(topic_raw))
    tail = b"".join(
        (
            topic_len,
            topic_raw,
            _PROPS_LEN.pack(props_len + reserved),
            properties,
            RECORD_CRC_PLACEHOLDER if record_crc else b"",
        )
    )
    return PreparedMessage(
        size=size,
        header=HEADERS[(born_bytes, store_bytes)],
        magic=MAGIC_V2 if v2 else MAGIC_V1,
        body_crc=body_crc(body),
        queue_id=queue_id,
        flag=flag,
        sys_flag=sys_flag,
        born_timestamp_ms=born_timestamp_ms,
        born_host=born_host,
        reconsume_times=reconsume_times,
        prepared_tx_offset=prepared_tx_offset,
        body=body,
        tail=tail,
        topic=topic,
        gets_queue_offset=sysflag.gets_queue_offset(sys_flag),
        record_crc=record_crc,
    )


def producer_properties_bytes_max(limits: MessageLimits) -> int:
    """The properties a producer may send: the limit less the CRC property the store ends
    every record with by default (a client checks against this before it sends)."""
    return limits.properties_bytes_max - RECORD_CRC_BYTES


def properties_too_large(
    props_len: int, limits: MessageLimits, reserved: int
) -> PropertiesTooLarge:
    """The refusal of properties over the limit, which the CRC property's bytes count against."""
    limit = limits.properties_bytes_max - reserved
    why = f" ({limits.properties_bytes_max} less {reserved} for the record CRC)" if reserved else ""
    return PropertiesTooLarge(
        f"properties are {props_len} bytes, over the {limit}-byte limit{why}", field="properties"
    )


def validate_topic(topic: str, limits: MessageLimits = MessageLimits()) -> bytes:  # noqa: B008 - frozen, shared
    """The topic's bytes, or MessageIllegal when its name or length is not allowed."""
    if not topic or not TOPIC_PATTERN.match(topic):
        raise MessageIllegal(
            f"topic {topic!r} must be non-empty and match {TOPIC_PATTERN.pattern}", field="topic"
        )
    raw = topic.encode("ascii")  # the pattern admits ASCII only
    limit = limits.system_topic_bytes_max if is_system_topic(topic) else limits.topic_bytes_max
    if len(raw) > limit:
        raise MessageIllegal(
            f"topic is {len(raw)} bytes, over the {limit}-byte limit", field="topic"
        )
    return raw


def write_prepared(
    buf: WritableBuffer,
    pos: int,
    msg: PreparedMessage,
    *,
    queue_offset: int,
    physical_offset: int,
    store_timestamp_ms: int,
    store_host: bytes,
) -> int:
    """Write a prepared message at `pos` of `buf`, its whole-record CRC last; returns its
    size."""
    header = msg.header
    header.pack_into(
        buf,
        pos,
        msg.size,
        msg.magic,
        msg.body_crc,
        msg.queue_id,
        msg.flag,
        queue_offset,
        physical_offset,
        msg.sys_flag,
        msg.born_timestamp_ms,
        msg.born_host,
        store_timestamp_ms,
        store_host,
        msg.reconsume_times,
        msg.prepared_tx_offset,
        len(msg.body),
    )
    p = pos + header.size
    end_body = p + len(msg.body)
    buf[p:end_body] = msg.body
    end = pos + msg.size
    buf[end_body:end] = msg.tail
    if msg.record_crc:
        buf[end - RECORD_CRC_BYTES : end] = record_crc_property(record_crc(buf, pos, msg.size))
    return msg.size


def encode_record(
    *,
    topic: str,
    queue_id: int,
    body: Buffer,
    properties: bytes = b"",
    flag: int = 0,
    queue_offset: int = 0,
    physical_offset: int = 0,
    sys_flag: int = 0,
    born_timestamp_ms: int = 0,
    born_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x00\x00",
    store_timestamp_ms: int = 0,
    store_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x00\x00",
    reconsume_times: int = 0,
    prepared_tx_offset: int = 0,
    limits: MessageLimits = MessageLimits(),  # noqa: B008 - frozen, shared default
    record_crc: bool = True,
) -> bytes:
    """One whole record as bytes (tests, tools); the commit log writes in place instead.
    `record_crc` False: without the whole-record CRC, as RocketMQ writes by default."""
    if len(store_host) not in (IPV4_HOST_BYTES, IPV6_HOST_BYTES):
        raise MessageIllegal("store host must be 8 or 20 bytes", field="store_host")
    msg = prepare_message(
        topic=topic,
        queue_id=queue_id,
        body=body,
        properties=properties,
        flag=flag,
        sys_flag=sys_flag,
        born_timestamp_ms=born_timestamp_ms,
        born_host=born_host,
        reconsume_times=reconsume_times,
        prepared_tx_offset=prepared_tx_offset,
        store_host_v6=len(store_host) == IPV6_HOST_BYTES,
        limits=limits,
        record_crc=record_crc,
    )
    out = bytearray(msg.size)
    write_prepared(
        out,
        0,
        msg,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        store_timestamp_ms=store_timestamp_ms,
        store_host=store_host,
    )
    return bytes(out)


def encode_blank(remaining_bytes: int) -> bytes:
    """The 8-byte end-of-file blank; TOTALSIZE is the whole rest of the file."""
    return SIZE_MAGIC.pack(remaining_bytes, BLANK_MAGIC)


# ---------------------------------------------------------------------------------------------
# Decoding


# Not frozen: a frozen dataclass sets each field through object.__setattr__, a cost per field
# of every object, and one is made per message on hot paths. Treat it as a value: nothing
# assigns to its fields, and unsafe_hash makes it hashable as a frozen one is.
@dataclass(slots=True, unsafe_hash=True)
class Record:
    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: bytes
    store_timestamp_ms: int
    store_host: bytes
    reconsume_times: int
    prepared_tx_offset: int
    body: bytes
    topic: str
    # The producer's properties: a whole-record CRC property at their end is taken off into
    # `record_crc` (its value, or NO_RECORD_CRC; DAMAGED_RECORD_CRC, its bytes left here, only
    # when read without the CRC check).
    properties: bytes
    record_crc: int = NO_RECORD_CRC

    @property
    def v2(self) -> bool:
        return self.magic == MAGIC_V2

    def properties_dict(self) -> dict[str, str]:
        return decode_properties(self.properties)


@dataclass(slots=True, frozen=True)
class Blank:
    """The end-of-file filler: the rest of this segment holds nothing."""

    total_size: int


@dataclass(slots=True, frozen=True)
class Bad:
    """Bytes that are not a valid record. `size` is the claimed TOTALSIZE when the length
    field itself was readable and sane, else -1. `record` holds the decoded fields when only
    the CRC or the offset check failed: they are not to be served, but tell what was there."""

    reason: str
    size: int = -1
    record: Record | None = None
    # True when no record magic is there at all (not a record boundary, or empty space), as
    # opposed to a record that is there but damaged.
    no_record: bool = False


ReadResult: TypeAlias = Record | Blank | Bad

# The reasons of the CRC checks' Bad verdicts.
BODY_CRC_MISMATCH: Final = "body CRC mismatch"
RECORD_CRC_MISMATCH: Final = "record CRC mismatch"
RECORD_CRC_DAMAGED: Final = f"the {RECORD_CRC} property holding the record CRC is damaged"


def read_record(
    buf: Buffer,
    pos: int,
    end: int,
    *,
    check_crc: bool = True,
    expected_offset: int = -1,
) -> ReadResult:
    """Decode the record at `buf[pos:end]`, checking it as RocketMQ's
    `checkMessageAndReturnSize` does, plus: the PHYSICALOFFSET field must equal
    `expected_offset` when one is given (it catches stale or misplaced bytes). `check_crc`:
    the whole-record CRC when the record carries it, else the body CRC (see the top).
    """
    remaining = end - pos
    if remaining < 8:
        return Bad("fewer than 8 bytes left", no_record=True)
    total, magic = SIZE_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        return Blank(total)
    if magic not in (MAGIC_V1, MAGIC_V2):
        return Bad(f"illegal magic code {magic & 0xFFFFFFFF:#010x}", no_record=True)
    if total < RECORD_BYTES_MIN or total > remaining:
        return Bad(f"total size {total} does not fit the {remaining} bytes left")
    (sys_flag,) = _I32.unpack_from(buf, pos + SYSFLAG_POS)
    header = HEADERS[host_bytes_for_flag(sys_flag)]
    if total < header.size + 3:
        return Bad(f"total size {total} shorter than the header", total)
    (
        _,
        _,
        crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        _,
        born_ts,
        born_host,
        store_ts,
        store_host,
        reconsume,
        prepared_tx,
        body_len,
    ) = header.unpack_from(buf, pos)
    p = pos + header.size
    limit = pos + total
    if body_len < 0 or p + body_len > limit:
        return Bad(f"body length {body_len} runs past the record", total)
    body_start = p
    p += body_len
    v2 = magic == MAGIC_V2
    if v2:
        if p + 2 > limit:
            return Bad("topic length runs past the record", total)
        (topic_len,) = _TOPIC_LEN_V2.unpack_from(buf, p)
        p += 2
    else:
        if p + 1 > limit:
            return Bad("topic length runs past the record", total)
        topic_len = buf[p]
        p += 1
    if topic_len < 0 or p + topic_len + 2 > limit:
        return Bad(f"topic length {topic_len} runs past the record", total)
    topic_raw = bytes(buf[p : p + topic_len])
    p += topic_len
    (props_len,) = _PROPS_LEN.unpack_from(buf, p)
    p += 2
    if props_len < 0:
        return Bad(f"negative properties length {props_len}", total)
    expected = record_length(
        body_len,
        topic_len,
        props_len,
        born_host_bytes=len(born_host),
        store_host_bytes=len(store_host),
        v2=v2,
    )
    if expected != total:
        return Bad(f"total size {total} but the fields add up to {expected}", total)
    body = bytes(buf[body_start : body_start + body_len])
    try:
        topic = topic_raw.decode("utf-8")
    except UnicodeDecodeError:
        return Bad("topic is not UTF-8", total)
    # The body CRC covers neither the topic nor the properties, so a write torn after the body
    # (zeros where it stopped) would pass every check above. Both have a shape to check: a topic
    # is never empty and never holds a NUL, and properties end with 0x02 (every pair does).
    if not topic or "\x00" in topic:
        return Bad("topic is empty or holds a NUL byte (a torn write)", total)
    if props_len and buf[p + props_len - 1] != PROPERTIES_END_BYTE:
        return Bad("properties do not end with 0x02 (a torn write)", total)
    stored = stored_record_crc(buf, pos + total, props_len)
    props_end = p + props_len - (RECORD_CRC_BYTES if stored >= 0 else 0)
    record = Record(
        total_size=total,
        magic=magic,
        body_crc=crc,
        queue_id=queue_id,
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
        body=body,
        topic=topic,
        properties=bytes(buf[p:props_end]),
        record_crc=stored,
    )
    if check_crc:
        if stored == DAMAGED_RECORD_CRC:
            return Bad(RECORD_CRC_DAMAGED, total, record)
        if stored >= 0:
            if record_crc(buf, pos, total) != stored:
                return Bad(RECORD_CRC_MISMATCH, total, record)
        elif body_len > 0 and body_crc(body) != crc:
            return Bad(BODY_CRC_MISMATCH, total, record)
    if expected_offset >= 0 and physical_offset != expected_offset:
        return Bad(
            f"physical offset field {physical_offset} != position {expected_offset}", total, record
        )
    return record


class CheckedFields(NamedTuple):
    """The fields of a record other than its body, read by `fields_without_body`."""

    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: bytes
    store_timestamp_ms: int
    store_host: bytes
    reconsume_times: int
    total_size: int
    topic: str
    properties: bytes
    record_crc: int


def without_body(raw: Buffer) -> bytes:
    """ONE whole record that read_record (or record_columns.check_records) has accepted, its
    body cut out: the bytes before the body (TOTALSIZE .. BODYLENGTH, which still says how
    long the body was) and the bytes after it (the topic and the properties), joined. What a
    lazily decoded message keeps for its other fields (`fields_without_body`): its body is its
    own bytes already, and at 1 KiB the rest is ~150 bytes where the whole record is ~1.2 KB.
    The compiled cut (_core.lazy_messages) is pinned to this one byte for byte."""
    (sys_flag,) = _I32.unpack_from(raw, SYSFLAG_POS)
    header = HEADERS[host_bytes_for_flag(sys_flag)].size
    (body_len,) = _I32.unpack_from(raw, header - 4)
    return bytes(raw[:header]) + bytes(raw[header + body_len :])


def fields_without_body(cut: Buffer) -> CheckedFields:
    """The fields of an accepted record from `without_body`'s bytes: the same values as
    read_record's, with none of its checks and no Record built (a lazily decoded message's
    first read of a field other than the body)."""
    (sys_flag,) = _I32.unpack_from(cut, SYSFLAG_POS)
    header = HEADERS[host_bytes_for_flag(sys_flag)]
    (
        total,
        magic,
        _,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        _,
        born_ts,
        born_host,
        store_ts,
        store_host,
        reconsume,
        _,
        body_len,
    ) = header.unpack_from(cut, 0)
    p = header.size  # the body is cut out: the topic's length follows the header
    if magic == MAGIC_V2:
        (topic_len,) = _TOPIC_LEN_V2.unpack_from(cut, p)
        p += 2
    else:
        topic_len = cut[p]
        p += 1
    topic = bytes(cut[p : p + topic_len]).decode("utf-8")
    p += topic_len
    (props_len,) = _PROPS_LEN.unpack_from(cut, p)
    p += 2
    stored = stored_record_crc(cut, total - body_len, props_len)
    props_end = p + props_len - (RECORD_CRC_BYTES if stored >= 0 else 0)
    return CheckedFields(
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag,
        born_ts,
        born_host,
        store_ts,
        store_host,
        reconsume,
        total,
        topic,
        bytes(cut[p:props_end]),
        stored,
    )


# The fields of a record in order, as field_spans names them (the layout table at the top).
FIXED_FIELDS: Final = (
    ("TOTALSIZE", 4),
    ("MAGICCODE", 4),
    ("BODYCRC", 4),
    ("QUEUEID", 4),
    ("FLAG", 4),
    ("QUEUEOFFSET", 8),
    ("PHYSICALOFFSET", 8),
    ("SYSFLAG", 4),
    ("BORNTIMESTAMP", 8),
    ("BORNHOST", 0),  # 8 or 20: SYSFLAG says
    ("STORETIMESTAMP", 8),
    ("STOREHOST", 0),
    ("RECONSUMETIMES", 4),
    ("PREPAREDTXOFFSET", 8),
    ("BODYLENGTH", 4),
)


def field_spans(raw: Buffer) -> list[tuple[str, int, int]]:
    """(name, start, end) of every field of the ONE whole record `raw`, its lengths taken as
    they read (a damaged length gives the spans it implies): the fixed fields, then BODY,
    TOPICLENGTH, TOPIC, PROPERTIESLENGTH, PROPERTIES and, when the record ends with it, the
    CRC property (named __CRC32#). Spans past the record's end are cut at it."""
    total = len(raw)
    (sys_flag,) = _I32.unpack_from(raw, SYSFLAG_POS)
    born, store = host_bytes_for_flag(sys_flag)
    spans: list[tuple[str, int, int]] = []
    at = 0
    for name, fixed in FIXED_FIELDS:
        width = fixed or (born if name == "BORNHOST" else store)
        spans.append((name, at, at + width))
        at += width
    (body_len,) = _I32.unpack_from(raw, at - 4)
    v2 = _I32.unpack_from(raw, MAGIC_POS)[0] == MAGIC_V2
    topic_len_bytes = 2 if v2 else 1
    body_end = at + max(body_len, 0)
    spans.append(("BODY", at, body_end))
    topic_at = body_end + topic_len_bytes
    topic_len = 0
    if topic_at <= total:
        topic_len = _TOPIC_LEN_V2.unpack_from(raw, body_end)[0] if v2 else raw[body_end]
    spans.append(("TOPICLENGTH", body_end, topic_at))
    props_at = topic_at + max(topic_len, 0)
    spans.append(("TOPIC", topic_at, props_at))
    props_len = _PROPS_LEN.unpack_from(raw, props_at)[0] if props_at + 2 <= total else 0
    spans.append(("PROPERTIESLENGTH", props_at, props_at + 2))
    props_end = props_at + 2 + max(props_len, 0)
    crc_at = props_end
    if props_end <= total and stored_record_crc(raw, props_end, props_len) != NO_RECORD_CRC:
        crc_at = props_end - RECORD_CRC_BYTES
    spans.append(("PROPERTIES", props_at + 2, crc_at))
    if crc_at < props_end:
        spans.append((RECORD_CRC, crc_at, props_end))
    return [(name, min(a, total), min(b, total)) for name, a, b in spans]


# ---------------------------------------------------------------------------------------------
# Resynchronising after a bad record

MAGIC_V1_BYTES: Final = _I32.pack(MAGIC_V1)
MAGIC_V2_BYTES: Final = _I32.pack(MAGIC_V2)

Searchable: TypeAlias = bytes | bytearray | mmap.mmap


def find_next_record(buf: Searchable, start: int, end: int, base_offset: int) -> int:
    """The first position p in (start, end) where a whole valid record starts whose
    PHYSICALOFFSET field equals `base_offset + p`; -1 if there is none.

    Used after a bad record to tell a corrupt record in the middle (valid records follow) from a
    torn tail (nothing valid follows). Requiring the offset field to match the position rules out
    stale or shifted copies of records; the CRC rules out garbage that merely looks like one.
    """
    candidates = []
    for magic in (MAGIC_V1_BYTES, MAGIC_V2_BYTES):
        p = buf.find(magic, start + 1 + 4, end)
        if p >= 0:
            candidates.append((p, magic))
    while candidates:
        candidates.sort()
        p, magic = candidates.pop(0)
        pos = p - 4
        result = read_record(buf, pos, end, check_crc=True, expected_offset=base_offset + pos)
        if isinstance(result, Record):
            return pos
        nxt = buf.find(magic, p + 1, end)
        if nxt >= 0:
            candidates.append((nxt, magic))
    return -1


# ---------------------------------------------------------------------------------------------
# Fast validation of a run of records (recovery)


def scan_run(
    buf: Buffer,
    pos: int,
    end: int,
    base_offset: int,
    *,
    check_crc: bool = True,
    queue_table: dict[str, dict[int, int]] | None = None,
    apply_from: int = 0,
) -> tuple[int, int, ReadResult | None]:
    """Walk the valid records of buf[pos:end] (whose first byte sits at commit-log offset
    `base_offset`) without building a Record for each. Returns (position after the last valid
    record, records walked, what stopped the walk): None at `end`, a Blank, or a Bad.

    Every check is read_record's; on any doubt the record is handed to read_record and its
    verdict stands, so the two can never disagree. With `queue_table`, each record at or after
    `apply_from` that takes a queue offset raises its queue's next offset to queue_offset + 1.
    """
    count = 0
    topics: dict[bytes, str] = {}
    unpack_prefix = RECORD_PREFIX.unpack_from
    unpack_i32 = _I32.unpack_from
    with memoryview(buf) as view:
        while pos < end:
            remaining = end - pos
            if remaining < RECORD_PREFIX_BYTES:
                return (
                    pos,
                    count,
                    read_record(
                        buf, pos, end, check_crc=check_crc, expected_offset=base_offset + pos
                    ),
                )
            total, magic, crc, _, _, queue_offset, physical, flags = unpack_prefix(buf, pos)
            if magic == BLANK_MAGIC:
                return pos, count, Blank(total)
            header_size = (
                HEADER_V4_V4.size
                + (V6_EXTRA_BYTES if flags & sysflag.BORNHOST_V6 else 0)
                + (V6_EXTRA_BYTES if flags & sysflag.STOREHOST_V6 else 0)
            )
            ok = (
                magic in (MAGIC_V1, MAGIC_V2)
                and RECORD_BYTES_MIN <= total <= remaining
                and physical == base_offset + pos
                and total >= header_size + 3
            )
            if ok:
                (body_len,) = unpack_i32(buf, pos + header_size - 4)
                topic_at = pos + header_size + body_len
                v2 = magic == MAGIC_V2
                ok = body_len >= 0 and topic_at + (2 if v2 else 1) <= pos + total
            if ok:
                if v2:
                    (topic_len,) = _TOPIC_LEN_V2.unpack_from(buf, topic_at)
                    topic_start = topic_at + 2
                else:
                    topic_len = buf[topic_at]
                    topic_start = topic_at + 1
                props_at = topic_start + topic_len
                ok = topic_len >= 0 and props_at + 2 <= pos + total
            if ok:
                (props_len,) = _PROPS_LEN.unpack_from(buf, props_at)
                ok = props_len >= 0 and props_at + 2 + props_len == pos + total
                if ok and props_len:
                    ok = buf[props_at + 1 + props_len] == PROPERTIES_END_BYTE
            if ok:
                raw_topic = bytes(view[topic_start : topic_start + topic_len])
                topic = topics.get(raw_topic, "")
                if not topic:
                    try:
                        topic = raw_topic.decode("utf-8")
                    except UnicodeDecodeError:
                        topic = ""
                    if topic and "\x00" not in topic:
                        topics[raw_topic] = topic
                    else:
                        ok = False
            if ok and check_crc:
                stored = stored_record_crc(buf, pos + total, props_len)
                if stored >= 0:
                    ok = crc32(view[pos : pos + total - RECORD_CRC_BYTES]) & _CRC_MASK == stored
                elif stored == NO_RECORD_CRC and body_len > 0:
                    body_start = pos + header_size
                    ok = (crc32(view[body_start : body_start + body_len]) & _CRC_MASK) == crc
                else:
                    ok = stored == NO_RECORD_CRC
            slow: Record | None = None
            if not ok:
                found = read_record(
                    buf, pos, end, check_crc=check_crc, expected_offset=base_offset + pos
                )
                if not isinstance(found, Record):
                    return pos, count, found
                slow = found
            if (
                queue_table is not None
                and base_offset + pos >= apply_from
                and flags & sysflag.TRANSACTION_MASK
                in (sysflag.TRANSACTION_NOT_TYPE, sysflag.TRANSACTION_COMMIT_TYPE)
            ):
                if slow is not None:
                    topic = slow.topic
                (queue_id,) = unpack_i32(buf, pos + QUEUE_ID_POS)
                queues = queue_table.setdefault(topic, {})
                if queues.get(queue_id, 0) <= queue_offset:
                    queues[queue_id] = queue_offset + 1
            pos += total
            count += 1
    return pos, count, None
