"""Body compression, marked in SYSFLAG the way RocketMQ marks it.

    SYSFLAG bit 0x1 (COMPRESSED) says the stored body is compressed; bits 0x700 say how:
    0x100 LZ4 (frame format), 0x200 ZSTD (frame), 0x300 ZLIB (zlib stream). A body marked
    COMPRESSED with no type bits is ZLIB (RocketMQ before 5.x wrote only the bit).

The producer compresses bodies over a threshold (RocketMQ's compressMsgBodyOverHowmuch, 4 KiB)
and keeps the original when compression does not make it smaller; the consumer undoes it.
BODYCRC covers the body as stored (compressed), as in RocketMQ.
"""

from __future__ import annotations

import enum
import zlib

import lz4.frame
import zstandard

from mqstore.client.errors import DataLoss
from mqstore.formats import sysflag

COMPRESS_OVER_BYTES_DEFAULT = 4096
ZLIB_LEVEL_DEFAULT = 5  # RocketMQ's compressLevel
ZSTD_LEVEL_DEFAULT = 3
LZ4_LEVEL_DEFAULT = 0
# A compressed body never expands past this when decompressed (the store's body limit is
# 4 MiB; this bounds what a hostile body can make a consumer allocate).
DECOMPRESSED_BYTES_MAX = 64 << 20


class Compression(enum.Enum):
    NONE = "none"
    ZLIB = "zlib"
    LZ4 = "lz4"
    ZSTD = "zstd"


_TYPE_BITS = {
    Compression.LZ4: sysflag.COMPRESSION_LZ4,
    Compression.ZSTD: sysflag.COMPRESSION_ZSTD,
    Compression.ZLIB: sysflag.COMPRESSION_ZLIB,
}
_BY_BITS = {bits: kind for kind, bits in _TYPE_BITS.items()}


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
    return packed, sysflag.COMPRESSED | _TYPE_BITS[kind]


def compression_of(sys_flag: int) -> Compression:
    if not sys_flag & sysflag.COMPRESSED:
        return Compression.NONE
    bits = sys_flag & sysflag.COMPRESSION_TYPE_MASK
    if bits == 0:
        return Compression.ZLIB
    kind = _BY_BITS.get(bits)
    if kind is None:
        raise DataLoss(f"unknown compression type bits {bits:#x} in sys flag {sys_flag:#x}")
    return kind


def decompress(body: bytes, sys_flag: int) -> bytes:
    """The original body of a stored one (unchanged when not marked compressed)."""
    kind = compression_of(sys_flag)
    try:
        if kind is Compression.NONE:
            return body
        if kind is Compression.ZLIB:
            d = zlib.decompressobj()
            out = d.decompress(body, DECOMPRESSED_BYTES_MAX)
            if d.unconsumed_tail or not d.eof:
                raise DataLoss("zlib body is truncated or decompresses past the limit")
            return out
        if kind is Compression.LZ4:
            lz = lz4.frame.LZ4FrameDecompressor()
            out = lz.decompress(body, max_length=DECOMPRESSED_BYTES_MAX + 1)
            if not lz.eof:
                raise DataLoss("lz4 body is truncated or decompresses past the limit")
        else:
            out = zstandard.ZstdDecompressor().decompress(
                body, max_output_size=DECOMPRESSED_BYTES_MAX
            )
    except DataLoss:
        raise
    except Exception as exc:  # each library raises its own error type for bad input
        raise DataLoss(f"{kind.value} body does not decompress: {exc}") from exc
    if len(out) > DECOMPRESSED_BYTES_MAX:
        raise DataLoss("body decompresses past the limit")
    return bytes(out)
