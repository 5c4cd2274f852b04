"""Exact-mode companion of an index file: the 64-bit hash of every entry's key. mqstore's own.

    0      4     6       8         12        16                       16 + 8*N
    +------+-----+-------+---------+---------+------------------------+
    | magic| ver | zero  | entry   | header  | N hashes, u64          |
    | MQXH |     |       | num N   | crc32c  | (hash 0 never used)    |
    +------+-----+-------+---------+---------+------------------------+
      4s     u16   u16     i32       u32       big-endian

Hash n belongs to entry n of the index file with the same name (`<name>.hash64`): BLAKE2b-64 of
`topic#key` (mqstore.sharding.key_hash64). A query drops an entry whose 32-bit Java hash matches
but whose 64-bit hash does not, before any commit-log read: two different keys survive both only
with probability about 2**-64 per pair, and the caller's confirm step catches even those.

The header is written once, at creation, and carries its own CRC32C. The hashes are guarded by a
running CRC32C kept in the index checkpoint's file record (a CRC per 8-byte hash would double the
file). A companion that is missing or fails a check only costs precision: the file's entries are
then returned unfiltered and the confirm step sorts them out.
"""

from __future__ import annotations

import struct

import crc32c

from mqstore.errors import CorruptFile

MAGIC = b"MQXH"
VERSION = 1
SUFFIX = ".hash64"
_HEAD = struct.Struct(">4sHHi")
_CRC = struct.Struct(">I")
HEADER_BYTES = _HEAD.size + _CRC.size
assert HEADER_BYTES == 16
HASH = struct.Struct(">Q")
HASH_BYTES = HASH.size
HASH_DTYPE = ">u8"


def file_bytes(entry_num: int) -> int:
    return HEADER_BYTES + entry_num * HASH_BYTES


def hash_pos(number: int) -> int:
    return HEADER_BYTES + number * HASH_BYTES


def encode_header(entry_num: int) -> bytes:
    head = _HEAD.pack(MAGIC, VERSION, 0, entry_num)
    return head + _CRC.pack(crc32c.crc32c(head))


def decode_header(data: bytes, *, path: str = "<hash64>") -> int:
    """The entry count N the companion was made for; CorruptFile if the header is not intact."""
    if len(data) < HEADER_BYTES:
        raise CorruptFile(path, "shorter than a companion header")
    magic, version, _zero, entry_num = _HEAD.unpack_from(data, 0)
    (stored,) = _CRC.unpack_from(data, _HEAD.size)
    if crc32c.crc32c(bytes(data[: _HEAD.size])) != stored:
        raise CorruptFile(path, "companion header CRC32C mismatch")
    if magic != MAGIC or version != VERSION:
        raise CorruptFile(path, f"magic {magic!r} version {version}: not a companion file")
    return int(entry_num)
