"""The commit-log record decoder over arbitrary bytes: read_record, scan_run, the compiled
walk (record_columns.scan_run_fast), find_next_record.

Input: a flags byte (bit 0: check the CRC, bit 1: a non-zero base offset), the start position,
then the buffer itself. Rules:

    read_record     returns Record, Blank or Bad, never raises; a Record lies inside the buffer
                    and writes back (write_prepared, the store's own writer) to exactly the
                    bytes it was read from, so no byte was skipped or misread; when its fields
                    are within the writer's limits, encode_record gives those bytes too
    scan_run        agrees with a walk of read_record calls: the same end, count, stop verdict
                    (Blank size, Bad reason) and queue-offset table; so does scan_run_fast
                    (formats/_core.pyx), which never raises on any bytes
    find_next_record  -1, or a position after the start where a CRC-checked record with the
                    matching offset field starts
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from fuzz.draw import Draw
from fuzz.findings import check
from mqstore.errors import InvalidArgument
from mqstore.formats import sysflag
from mqstore.formats.properties import encode_properties
from mqstore.formats.record import (
    HEADERS,
    MAGIC_V2,
    RECORD_CRC_BYTES,
    RECORD_CRC_PLACEHOLDER,
    Bad,
    Blank,
    PreparedMessage,
    ReadResult,
    Record,
    encode_blank,
    encode_record,
    find_next_record,
    read_record,
    scan_run,
    write_prepared,
)
from mqstore.formats.record_columns import scan_run_fast

DESCRIPTION = (
    "read_record / scan_run / scan_run_fast / find_next_record over arbitrary bytes: only "
    "Record/Blank/Bad, a Record writes back to its bytes, both walks agree with read_record"
)
# Packages atheris instruments for coverage (fuzz/engine.py).
INSTRUMENT = ("mqstore",)

_CRC_FIELD = slice(8, 12)
_BASE_OFFSET_MAX = 1 << 40
QueueTable = dict[str, dict[int, int]]


def check_buffer(buf: bytes, pos: int, base_offset: int, check_crc: bool) -> None:
    end = len(buf)
    pos = min(max(pos, 0), end)
    for expected in (base_offset + pos, -1):
        got = read_record(buf, pos, end, check_crc=check_crc, expected_offset=expected)
        check_result(got, buf, pos, end, check_crc)
    check_scan(buf, pos, base_offset, check_crc)
    found = find_next_record(buf, pos, end, base_offset)
    if found != -1:
        check(found > pos, "record.find-next-not-after-start", f"{found} <= start {pos}")
        again = read_record(buf, found, end, check_crc=True, expected_offset=base_offset + found)
        check(
            isinstance(again, Record),
            "record.find-next-not-a-record",
            f"find_next_record gave {found}, read_record says {again}",
        )


def check_result(got: ReadResult, buf: bytes, pos: int, end: int, check_crc: bool) -> None:
    check(
        isinstance(got, Record | Blank | Bad),
        "record.unexpected-result",
        f"read_record returned {type(got).__name__}",
    )
    if isinstance(got, Record):
        check(
            0 < got.total_size <= end - pos,
            "record.size-outside-buffer",
            f"record of {got.total_size} bytes at {pos} in a buffer ending at {end}",
        )
        raw = buf[pos : pos + got.total_size]
        check_writes_back(got, raw, check_crc=check_crc)


def check_writes_back(r: Record, raw: bytes, *, check_crc: bool) -> None:
    """The record's fields, written by the store's own writer, are the bytes read. A record
    with the whole-record CRC was checked by it (when the CRCs were checked) and the writer
    computes it again; a record without it by its body CRC."""
    has_crc = r.record_crc >= 0
    whole_checked = check_crc and has_crc
    body_checked = check_crc and not has_crc and bool(r.body)
    v2 = r.magic == MAGIC_V2
    topic_raw = r.topic.encode("utf-8")
    tail = b"".join(
        (
            struct.pack(">h" if v2 else ">B", len(topic_raw)),
            topic_raw,
            struct.pack(">h", len(r.properties) + (RECORD_CRC_BYTES if has_crc else 0)),
            r.properties,
            RECORD_CRC_PLACEHOLDER if has_crc else b"",
        )
    )
    msg = PreparedMessage(
        size=r.total_size,
        header=HEADERS[(len(r.born_host), len(r.store_host))],
        magic=r.magic,
        body_crc=r.body_crc,
        queue_id=r.queue_id,
        flag=r.flag,
        sys_flag=r.sys_flag,
        born_timestamp_ms=r.born_timestamp_ms,
        born_host=r.born_host,
        reconsume_times=r.reconsume_times,
        prepared_tx_offset=r.prepared_tx_offset,
        body=r.body,
        tail=tail,
        topic=r.topic,
        gets_queue_offset=sysflag.gets_queue_offset(r.sys_flag),
        record_crc=has_crc,
    )
    out = bytearray(r.total_size)
    write_prepared(
        out,
        0,
        msg,
        queue_offset=r.queue_offset,
        physical_offset=r.physical_offset,
        store_timestamp_ms=r.store_timestamp_ms,
        store_host=r.store_host,
    )
    if has_crc and not whole_checked:  # read unchecked: its stored CRC may be any number
        out[-RECORD_CRC_BYTES:] = raw[-RECORD_CRC_BYTES:]
    check(bytes(out) == raw, "record.misread", f"fields {r} write back to other bytes")
    try:
        encoded = encode_record(
            topic=r.topic,
            queue_id=r.queue_id,
            body=r.body,
            properties=r.properties,
            flag=r.flag,
            queue_offset=r.queue_offset,
            physical_offset=r.physical_offset,
            sys_flag=r.sys_flag,
            born_timestamp_ms=r.born_timestamp_ms,
            born_host=r.born_host,
            store_timestamp_ms=r.store_timestamp_ms,
            store_host=r.store_host,
            reconsume_times=r.reconsume_times,
            prepared_tx_offset=r.prepared_tx_offset,
            record_crc=has_crc,
        )
    except InvalidArgument:
        return  # the reader is lenient (RocketMQ's checks); the writer keeps its limits
    if encoded[:8] != raw[:8]:
        # A V2 record with a short topic (or the reverse) is legal to read; the writer picks
        # the magic from the topic length.
        return
    if not body_checked and encoded[_CRC_FIELD] != raw[_CRC_FIELD]:
        # Its BODYCRC was not checked (no body, the CRCs not checked, or the whole-record CRC
        # checked instead, which covers the field as written, right or not).
        encoded = encoded[: _CRC_FIELD.start] + raw[_CRC_FIELD] + encoded[_CRC_FIELD.stop :]
        whole_checked = False  # the writer's whole-record CRC covered its own BODYCRC
    if has_crc and not whole_checked:
        encoded = encoded[:-RECORD_CRC_BYTES] + raw[-RECORD_CRC_BYTES:]
    check(encoded == raw, "record.encode-differs", f"encode_record({r}) differs from its bytes")


def walk(
    buf: bytes, pos: int, end: int, base: int, check_crc: bool, table: QueueTable
) -> tuple[int, int, ReadResult | None]:
    """scan_run's contract, spelled out with one read_record per record."""
    count = 0
    while pos < end:
        got = read_record(buf, pos, end, check_crc=check_crc, expected_offset=base + pos)
        if not isinstance(got, Record):
            return pos, count, got
        if sysflag.gets_queue_offset(got.sys_flag):
            queues = table.setdefault(got.topic, {})
            if queues.get(got.queue_id, 0) <= got.queue_offset:
                queues[got.queue_id] = got.queue_offset + 1
        pos += got.total_size
        count += 1
    return pos, count, None


def check_scan(buf: bytes, pos: int, base: int, check_crc: bool) -> None:
    end = len(buf)
    slow_table: QueueTable = {}
    slow = walk(buf, pos, end, base, check_crc, slow_table)
    for name, scan in (("scan", scan_run), ("compiled", scan_run_fast)):
        fast_table: QueueTable = {}
        fast = scan(buf, pos, end, base, check_crc=check_crc, queue_table=fast_table)
        check(
            fast[:2] == slow[:2],
            f"record.{name}-disagrees",
            f"{scan.__name__} stops at {fast[:2]}, read_record at {slow[:2]}",
        )
        check(
            _verdict(fast[2]) == _verdict(slow[2]),
            f"record.{name}-verdict-differs",
            f"{scan.__name__} says {fast[2]}, read_record {slow[2]}",
        )
        check(
            fast_table == slow_table,
            f"record.{name}-queue-table-differs",
            f"{fast_table} != {slow_table}",
        )


def _verdict(result: ReadResult | None) -> tuple[str, int | str]:
    if result is None:
        return ("end", 0)
    if isinstance(result, Blank):
        return ("blank", result.total_size)
    if isinstance(result, Bad):
        return ("bad", result.reason)
    return ("record", result.total_size)


def one_input(data: bytes) -> None:
    draw = Draw(data)
    flags = draw.byte()
    pos = draw.integer(0, 0xFFFF)
    base = draw.integer(0, _BASE_OFFSET_MAX) if flags & 2 else 0
    buf = draw.rest()
    check_buffer(buf, pos % (len(buf) + 1), base, check_crc=bool(flags & 1))


def setup() -> Callable[[bytes], None]:
    return one_input


def sample_records(base: int = 0) -> bytes:
    """Three records back to back (IPv4, IPv6 hosts, V2 topic; the second without the
    whole-record CRC) and an end-of-file blank, each with the offset field of its position past
    `base`."""
    out = b""
    pieces: list[dict[str, object]] = [
        {"topic": "T", "queue_id": 1, "body": b"hello", "properties": b"KEYS\x01k\x02"},
        {
            "topic": "Topic_6",
            "queue_id": 3,
            "body": b"",
            "born_host": bytes(16) + b"\0\0\0\x01",
            "store_host": bytes(15) + b"\x01\0\0\x10\x00",
            "properties": encode_properties({"TAGS": "a", "UNIQ_KEY": "U1"}),
            "record_crc": False,  # as RocketMQ writes by default
        },
        {"topic": "%RETRY%" + "g" * 130, "queue_id": 0, "body": b"x" * 40, "sys_flag": 0x8},
    ]
    for fields in pieces:
        out += encode_record(physical_offset=base + len(out), **fields)  # type: ignore[arg-type]
    return out + encode_blank(64)


def seeds() -> list[bytes]:
    head = bytes([1]) + bytes(4)  # check the CRC, start at 0, base 0
    records = sample_records()
    return [head + records, bytes([0]) + bytes(4) + records[:100], head + records[91:]]
