"""Body compression on the producer and consumer side (the codecs: mqstore/formats/compression.py).

    SYSFLAG bit 0x1 (COMPRESSED) says the stored body is compressed; bits 0x700 say how:
    0x100 LZ4 (frame format), 0x200 ZSTD (frame), 0x300 ZLIB (zlib stream). A body marked
    COMPRESSED with no type bits is ZLIB (RocketMQ before 5.x wrote only the bit).

The producer compresses bodies over a threshold (RocketMQ's compressMsgBodyOverHowmuch, 4 KiB)
and keeps the original when compression does not make it smaller; the consumer undoes it.
BODYCRC covers the body as stored (compressed), as in RocketMQ.
"""

from __future__ import annotations

import zlib

import lz4.frame
import zstandard

from mqstore.client.errors import DataLoss
from mqstore.formats import compression as codec
from mqstore.formats import sysflag
from mqstore.formats.compression import Compression

__all__ = [
    "COMPRESS_OVER_BYTES_DEFAULT",
    "DECOMPRESSED_BYTES_MAX",
    "Compression",
    "compress",
    "compression_of",
    "decompress",
]

COMPRESS_OVER_BYTES_DEFAULT = 4096
ZLIB_LEVEL_DEFAULT = 5  # RocketMQ's compressLevel
ZSTD_LEVEL_DEFAULT = 3
LZ4_LEVEL_DEFAULT = 0
# A compressed body never expands past this when decompressed: the store refuses at append a
# body over its 4 MiB body limit once decompressed, but a log written before that check, or by
# RocketMQ with a larger maxMessageSize, may hold more; this bounds what a hostile body can make
# a consumer allocate.
DECOMPRESSED_BYTES_MAX = 64 << 20


def compress(body: bytes, kind: Compression, level: int | None = None) -> tuple[bytes, int]:
    """(stored body, SYSFLAG bits to set). Returns the body unchanged with no bits when
    `kind` is NONE or compressing does not save space."""
    if kind is Compression.NONE:
        return body, 0
    if kind is Compression.ZLIB:
        packed = zlib.compress(body, ZLIB_LEVEL_DEFAULT if level is None else level)
    elif kind is Compression.LZ4:
        packed = lz4.frame.compress(
            body, compression_level=LZ4_LEVEL_DEFAULT if level is None else level
        )
    else:
        packed = zstandard.ZstdCompressor(
            level=ZSTD_LEVEL_DEFAULT if level is None else level
        ).compress(body)
    if len(packed) >= len(body):
        return body, 0
    return packed, sysflag.COMPRESSED | codec.TYPE_BITS[kind]


def compression_of(sys_flag: int) -> Compression:
    try:
        return codec.compression_of(sys_flag)
    except codec.UndecodableBody as exc:
        raise DataLoss(str(exc), field=exc.field) from None


def decompress(body: bytes, sys_flag: int) -> bytes:
    """The original body of a stored one (unchanged when not marked compressed); DataLoss
    when it does not decompress whole within DECOMPRESSED_BYTES_MAX."""
    if not sys_flag & sysflag.COMPRESSED:
        return body
    try:
        return codec.decompress(body, sys_flag, DECOMPRESSED_BYTES_MAX)
    except codec.UndecodableBody as exc:
        raise DataLoss(str(exc), field=exc.field) from None
