"""index_svc's checkpoint: how far the index is applied and durable, and what its files hold.

CRC32C-framed (mqstore.formats.framing, magic b"MQIC", version 1). Payload, big-endian:

    0    16   store_id          the commit log this index follows (zeros: none yet)
    16   8    confirmed_offset  every dispatch entry below it is applied and its bytes flushed:
                                the subscriber's confirmed offset of the start-up handshake
    24   8    min_offset        the commit log's minimum as last told (older candidates dropped)
    32   8    written_at_ms     wall clock when written (informational, never decided on)
    40   4    shard_count       the shard this index covers: keys whose mqstore.sharding shard
    44   4    shard_index         under shard_count is shard_index
    48   4    flags             bit 0 exact mode (files have companions); bit 1 clean close
    52   4    file_count
    56   ..   file_count file records, oldest first, 84 bytes each:

    0    8    name_ms           creation time, which is also the file name (yyyyMMddHHmmssSSS)
    8    4    slot_num          the file's geometry (a later config change leaves it alone)
    12   4    entry_num
    16   8    start_offset      replaying from here rebuilds this file (the applied offset when it
                                was created)
    24   8    end_offset        the file holds the keys of this shard of every message in
                                [start_offset, end_offset) (sealed: the next file's first offset;
                                the active file: the confirmed offset). Informational
    32   8    begin_ts_ms       the header as of this checkpoint, so that recovery can restore it
    40   8    end_ts_ms           even when a crash garbled the header's page
    48   8    begin_phy
    56   8    end_phy
    64   4    index_count       entries 1 .. index_count-1 are durable
    68   4    flags             bit 0 sealed (full, never written again); bit 1 has a companion;
                                bit 2 head_crc is set
    72   4    entries_crc       CRC32C of the bytes of entries 1 .. index_count-1
    76   4    head_crc          CRC32C of header and slots (set when sealed or closed cleanly)
    80   4    hash64_crc        CRC32C of the companion's hashes 1 .. index_count-1

Pure: encode and decode only. The I/O (write_atomic through the Disk seam) is the engine's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import crc32c

from mqstore.errors import CorruptFile
from mqstore.formats.framing import frame, unframe

MAGIC = b"MQIC"
VERSION = 1
STORE_ID_BYTES = 16
NO_STORE_ID = bytes(STORE_ID_BYTES)

_HEAD = struct.Struct(">16sqqqiiII")
assert _HEAD.size == 56
_FILE = struct.Struct(">qiiqqqqqqiIIII")
FILE_RECORD_BYTES = _FILE.size
assert FILE_RECORD_BYTES == 84

FLAG_EXACT = 0x1
FLAG_CLEAN_CLOSE = 0x2

FILE_SEALED = 0x1
FILE_HAS_COMPANION = 0x2
FILE_HEAD_CRC = 0x4


def region_crc(buf: Any, start: int, end: int, seed: int = 0) -> int:
    """The CRC32C of buf[start:end] continued from `seed`, as entries_crc, head_crc and
    hash64_crc are kept (`seed` when the range is empty)."""
    if end <= start:
        return seed
    with memoryview(buf) as view:
        return int(crc32c.crc32c(view[start:end], seed))


@dataclass(slots=True)
class FileRecord:
    name_ms: int
    slot_num: int
    entry_num: int
    start_offset: int
    end_offset: int
    begin_ts_ms: int = 0
    end_ts_ms: int = 0
    begin_phy: int = 0
    end_phy: int = 0
    index_count: int = 1
    flags: int = 0
    entries_crc: int = 0
    head_crc: int = 0
    hash64_crc: int = 0

    @property
    def sealed(self) -> bool:
        return bool(self.flags & FILE_SEALED)

    @property
    def has_companion(self) -> bool:
        return bool(self.flags & FILE_HAS_COMPANION)

    @property
    def has_head_crc(self) -> bool:
        return bool(self.flags & FILE_HEAD_CRC)


@dataclass(slots=True)
class IndexCheckpoint:
    store_id: bytes = NO_STORE_ID
    confirmed_offset: int = 0
    min_offset: int = 0
    written_at_ms: int = 0
    shard_count: int = 1
    shard_index: int = 0
    exact: bool = False
    clean_close: bool = False
    files: list[FileRecord] = field(default_factory=list)


def encode_checkpoint(ckpt: IndexCheckpoint) -> bytes:
    if len(ckpt.store_id) != STORE_ID_BYTES:
        raise ValueError("store_id must be 16 bytes")
    flags = (FLAG_EXACT if ckpt.exact else 0) | (FLAG_CLEAN_CLOSE if ckpt.clean_close else 0)
    parts = [
        _HEAD.pack(
            ckpt.store_id,
            ckpt.confirmed_offset,
            ckpt.min_offset,
            ckpt.written_at_ms,
            ckpt.shard_count,
            ckpt.shard_index,
            flags,
            len(ckpt.files),
        )
    ]
    for f in ckpt.files:
        parts.append(
            _FILE.pack(
                f.name_ms,
                f.slot_num,
                f.entry_num,
                f.start_offset,
                f.end_offset,
                f.begin_ts_ms,
                f.end_ts_ms,
                f.begin_phy,
                f.end_phy,
                f.index_count,
                f.flags,
                f.entries_crc,
                f.head_crc,
                f.hash64_crc,
            )
        )
    return frame(MAGIC, VERSION, b"".join(parts))


def decode_checkpoint(data: bytes, *, path: str = "checkpoint") -> IndexCheckpoint:
    version, payload = unframe(MAGIC, data, path=path)
    if version != VERSION:
        raise CorruptFile(path, f"unknown index checkpoint version {version}")
    if len(payload) < _HEAD.size:
        raise CorruptFile(path, "index checkpoint payload too short")
    store_id, confirmed, min_offset, written, count, index, flags, nfiles = _HEAD.unpack_from(
        payload, 0
    )
    if len(payload) != _HEAD.size + nfiles * FILE_RECORD_BYTES:
        raise CorruptFile(path, f"{nfiles} file records do not fill {len(payload)} bytes")
    files = [
        FileRecord(*_FILE.unpack_from(payload, _HEAD.size + i * FILE_RECORD_BYTES))
        for i in range(nfiles)
    ]
    return IndexCheckpoint(
        store_id=store_id,
        confirmed_offset=confirmed,
        min_offset=min_offset,
        written_at_ms=written,
        shard_count=count,
        shard_index=index,
        exact=bool(flags & FLAG_EXACT),
        clean_close=bool(flags & FLAG_CLEAN_CLOSE),
        files=files,
    )
