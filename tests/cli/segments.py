"""Builders of commit-log directories for the `mqstore log` tests.

`build_rocketmq_style` lays records out the way RocketMQ's CommitLog does, with our encoder but
none of our commit log: records back to back from offset 0 of each file, PHYSICALOFFSET = the
record's position, an 8-byte END_OF_FILE blank whenever the next record plus 8 bytes does not fit,
files named by their 20-digit start offset, and optionally the all-zero spare file RocketMQ's
AllocateMappedFileService pre-creates.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqstore.formats.properties import encode_properties
from mqstore.formats.record import encode_blank, encode_record


def host(ip: str, port: int) -> bytes:
    return ipaddress.ip_address(ip).packed + struct.pack(">i", port)


def host_text(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


@dataclass
class Msg:
    topic: str
    queue_id: int
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    queue_offset: int = 0
    sys_flag: int = 0
    born_timestamp_ms: int = 1_700_000_000_000
    born: tuple[str, int] = ("192.168.1.20", 50123)
    store_timestamp_ms: int = 1_700_000_000_500
    store: tuple[str, int] = ("10.0.0.7", 10911)
    reconsume_times: int = 0
    prepared_tx_offset: int = 0
    # RocketMQ writes no whole-record CRC unless enabledAppendPropCRC is on.
    record_crc: bool = False

    def encode(self, physical_offset: int) -> bytes:
        return encode_record(
            topic=self.topic,
            queue_id=self.queue_id,
            body=self.body,
            properties=encode_properties(self.properties),
            flag=self.flag,
            queue_offset=self.queue_offset,
            physical_offset=physical_offset,
            sys_flag=self.sys_flag,
            born_timestamp_ms=self.born_timestamp_ms,
            born_host=host(*self.born),
            store_timestamp_ms=self.store_timestamp_ms,
            store_host=host(*self.store),
            reconsume_times=self.reconsume_times,
            prepared_tx_offset=self.prepared_tx_offset,
            record_crc=self.record_crc,
        )


@dataclass
class Placed:
    offset: int
    size: int
    msg: Msg


def segment_name(offset: int) -> str:
    return f"{offset:020d}"


def build_rocketmq_style(
    directory: Path, file_bytes: int, msgs: list[Msg], *, spare_files: int = 1
) -> list[Placed]:
    directory.mkdir(parents=True, exist_ok=True)
    placed: list[Placed] = []
    start = 0
    buf = bytearray(file_bytes)
    pos = 0
    for m in msgs:
        size = len(m.encode(0))
        assert size + 8 <= file_bytes, "a record must fit an empty file with its blank"
        if pos + size + 8 > file_bytes:
            buf[pos : pos + 8] = encode_blank(file_bytes - pos)
            (directory / segment_name(start)).write_bytes(bytes(buf))
            start += file_bytes
            buf = bytearray(file_bytes)
            pos = 0
        raw = m.encode(start + pos)
        buf[pos : pos + size] = raw
        placed.append(Placed(start + pos, size, m))
        pos += size
    (directory / segment_name(start)).write_bytes(bytes(buf))
    for _ in range(spare_files):
        start += file_bytes
        (directory / segment_name(start)).write_bytes(bytes(file_bytes))
    return placed


def expected_json(offset: int, m: Msg, *, version: int) -> dict[str, Any]:
    """What `mqstore log dump` must print for a message, written out from the inputs."""
    store_raw = host(*m.store)
    born_v6 = ":" in m.born[0]
    store_v6 = ":" in m.store[0]
    flags = m.sys_flag | (0x10 if born_v6 else 0) | (0x20 if store_v6 else 0)
    return {
        "offset": offset,
        "version": version,
        "body_crc": zlib.crc32(m.body) & 0x7FFFFFFF,
        "record_crc": zlib.crc32(m.encode(offset)[:-20]) & 0x7FFFFFFF if m.record_crc else None,
        "crc_ok": True,
        "queue_id": m.queue_id,
        "flag": m.flag,
        "queue_offset": m.queue_offset,
        "physical_offset": offset,
        "sys_flag": flags,
        "born_timestamp_ms": m.born_timestamp_ms,
        "born_host": host_text(*m.born),
        "store_timestamp_ms": m.store_timestamp_ms,
        "store_host": host_text(*m.store),
        "reconsume_times": m.reconsume_times,
        "prepared_tx_offset": m.prepared_tx_offset,
        "topic": m.topic,
        "properties": m.properties,
        "body": base64.b64encode(m.body).decode(),
        "msg_id": (store_raw + struct.pack(">q", offset)).hex().upper(),
    }


def tree_digest(directory: Path) -> dict[str, tuple[str, int]]:
    """Name -> (sha256, mtime_ns) of every file under `directory`: to show nothing was written."""
    out = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            stat = path.stat()
            out[str(path.relative_to(directory))] = (
                hashlib.sha256(path.read_bytes()).hexdigest(),
                stat.st_mtime_ns,
            )
    return out


def one_byte_in_each_field(raw: bytes) -> dict[str, int]:
    """A byte of each field of the whole record `raw` (rocketmq-store.md §1.1, and the 20-byte
    whole-record CRC property at its end when it has one), worked out with struct from the
    layout table, not with mqstore's code: the last byte of numbers and hosts, the first of
    the body, topic and properties, and one digit of the CRC."""
    (sys_flag,) = struct.unpack_from(">i", raw, 36)
    born = 20 if sys_flag & 0x10 else 8
    store = 20 if sys_flag & 0x20 else 8
    header = 72 + born + store
    (body,) = struct.unpack_from(">i", raw, header - 4)
    v2 = raw[4:8] == bytes.fromhex("DAA320AB")
    topic_at = header + body
    topic = struct.unpack_from(">h", raw, topic_at)[0] if v2 else raw[topic_at]
    props_len_at = topic_at + (2 if v2 else 1) + topic
    at = {
        "TOTALSIZE": 3,
        "MAGICCODE": 7,
        "BODYCRC": 11,
        "QUEUEID": 15,
        "FLAG": 19,
        "QUEUEOFFSET": 27,
        "PHYSICALOFFSET": 35,
        "SYSFLAG": 39,
        "BORNTIMESTAMP": 47,
        "BORNHOST": 48 + born - 1,
        "STORETIMESTAMP": 48 + born + 7,
        "STOREHOST": 56 + born + store - 1,
        "RECONSUMETIMES": header - 13,
        "PREPAREDTXOFFSET": header - 5,
        "BODYLENGTH": header - 1,
        "BODY": header,
        "TOPICLENGTH": topic_at + (1 if v2 else 0),
        "TOPIC": props_len_at - topic,
        "PROPERTIESLENGTH": props_len_at + 1,
        "PROPERTIES": props_len_at + 2,
    }
    props_end = len(raw)
    if raw[-20:-11] == b"__CRC32#\x01":
        at["__CRC32#"] = len(raw) - 5
        props_end -= 20
    assert body > 0 and topic > 0 and props_end > at["PROPERTIES"], "every field non-empty"
    return at
