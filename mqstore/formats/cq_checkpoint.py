"""cq_svc's checkpoint: which commit log it follows and how far it is durably applied.

    {data_dir}/cq_checkpoint   CRC32C frame (mqstore.formats.framing), magic b"CQCK", version 1:

    0    16   store_id                the commit log followed (commitlog_svc's store.meta id);
                                      all zero before the first handshake
    16   8    confirmed_offset        every dispatch entry below it is applied and flushed
    24   8    min_commit_log_offset   the log's minimum when last told (correct_min_offset at
                                      start-up uses it before the handshake brings a fresh one)
    32   8    written_at_ms           informational

Written by cq_svc (cq_svc/checkpoint.py: write_atomic, so a crash leaves the old one or the
new one) and by the Spark rebuild job. A missing or corrupt checkpoint reads as confirmed
offset 0: recovery then trusts no unit, and the subscriber rebuilds from the log's minimum.
Pure: encode and decode only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from mqstore.errors import CorruptFile
from mqstore.formats.framing import frame, unframe

MAGIC = b"CQCK"
VERSION = 1
FILE_NAME = "cq_checkpoint"
_BODY = struct.Struct(">16sqqq")
NO_STORE_ID = bytes(16)


@dataclass(frozen=True, slots=True)
class CqCheckpoint:
    store_id: bytes = NO_STORE_ID
    confirmed_offset: int = 0
    min_commit_log_offset: int = 0
    written_at_ms: int = 0


def encode(ckpt: CqCheckpoint) -> bytes:
    return frame(
        MAGIC,
        VERSION,
        _BODY.pack(
            ckpt.store_id.ljust(16, b"\0")[:16],
            ckpt.confirmed_offset,
            ckpt.min_commit_log_offset,
            ckpt.written_at_ms,
        ),
    )


def decode(data: bytes, *, path: str = "<buffer>") -> CqCheckpoint:
    version, payload = unframe(MAGIC, data, path=path)
    if version != VERSION or len(payload) != _BODY.size:
        raise CorruptFile(path, f"version {version} with {len(payload)} payload bytes")
    store_id, confirmed, min_off, written = _BODY.unpack(payload)
    return CqCheckpoint(store_id, confirmed, min_off, written)
