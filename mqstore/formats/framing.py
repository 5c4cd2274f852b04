"""The frame around every metadata file that is mqstore's own (checkpoints, meta, snapshots).

    0       4        6          10            10+n       14+n
    +-------+--------+----------+-------------+----------+
    | magic | version| length n | payload     | crc32c   |   big-endian
    +-------+--------+----------+-------------+----------+
                                                ^ CRC32C of everything before it

RocketMQ's own formats keep RocketMQ's CRC; what is ours is guarded by CRC32C. A frame that is
short, has the wrong magic, or fails its CRC is reported as CorruptFile, never half-read.
"""

from __future__ import annotations

import struct

import crc32c

from mqstore.errors import CorruptFile

_HEAD = struct.Struct(">4sHI")
_CRC = struct.Struct(">I")
FRAME_OVERHEAD_BYTES = _HEAD.size + _CRC.size
assert FRAME_OVERHEAD_BYTES == 14


def frame(magic: bytes, version: int, payload: bytes) -> bytes:
    if len(magic) != 4:
        raise ValueError("magic must be 4 bytes")
    head = _HEAD.pack(magic, version, len(payload))
    body = head + payload
    return body + _CRC.pack(crc32c.crc32c(body))


def unframe(magic: bytes, data: bytes, *, path: str = "<buffer>") -> tuple[int, bytes]:
    """(version, payload) of a frame; CorruptFile if it is not whole and intact."""
    if len(data) < FRAME_OVERHEAD_BYTES:
        raise CorruptFile(path, f"{len(data)} bytes is shorter than a frame")
    got_magic, version, length = _HEAD.unpack_from(data, 0)
    if got_magic != magic:
        raise CorruptFile(path, f"magic {got_magic!r}, expected {magic!r}")
    end = _HEAD.size + length
    if end + _CRC.size != len(data):
        raise CorruptFile(path, f"frame says {length} payload bytes, file holds {len(data)}")
    (stored,) = _CRC.unpack_from(data, end)
    if crc32c.crc32c(data[:end]) != stored:
        raise CorruptFile(path, "CRC32C mismatch")
    return version, data[_HEAD.size : end]
