"""Body compression, marked in SYSFLAG the way RocketMQ marks it: the codecs, no I/O.

    SYSFLAG bit 0x1 (COMPRESSED) says the stored body is compressed; bits 0x700 say how:
    0x100 LZ4 (frame format), 0x200 ZSTD (frame), 0x300 ZLIB (zlib stream). A body marked
    COMPRESSED with no type bits is ZLIB (RocketMQ before 5.x wrote only the bit). Type bits
    without the COMPRESSED bit mean nothing (RocketMQ reads such a body as it is).

`decompress` is the one reading of a stored body: the SDK's consumer undoes compression with
it, and commitlog_svc refuses at append a body it cannot read back (commitlog_svc/
append_checks.py). It never makes more than `limit_bytes` (+1) of output, whatever the body
claims: a hostile body (a zip bomb: zlib inflates up to ~1,000x, zstd far more) costs at most
that much memory and inflate work. A zstd frame that declares its content size is refused past
the limit before anything is decompressed (zstandard's one-shot decompress allocates what the
header declares and ignores max_output_size then).

Bytes after the end of the compressed stream are ignored, as RocketMQ's readers (Java's
InflaterInputStream and friends) ignore them.
"""

from __future__ import annotations

import enum
import zlib

import lz4.frame
import zstandard

from mqstore.formats import sysflag


class Compression(enum.Enum):
    NONE = "none"
    ZLIB = "zlib"
    LZ4 = "lz4"
    ZSTD = "zstd"


TYPE_BITS = {
    Compression.LZ4: sysflag.COMPRESSION_LZ4,
    Compression.ZSTD: sysflag.COMPRESSION_ZSTD,
    Compression.ZLIB: sysflag.COMPRESSION_ZLIB,
}
_BY_BITS = {bits: kind for kind, bits in TYPE_BITS.items()}


class UndecodableBody(ValueError):
    """A body marked compressed that does not decompress with its codec within the limit.
    `field` is the message field at fault: "sys_flag" (type bits no codec has) or "body";
    `output_bytes` how much output the attempt made (the limit where a library does not say),
    for a caller that bounds the inflate work of many bodies together."""

    def __init__(self, message: str, *, field: str = "body", output_bytes: int = 0) -> None:
        super().__init__(message)
        self.field = field
        self.output_bytes = output_bytes


def compression_of(sys_flag: int) -> Compression:
    """The codec a SYSFLAG names; UndecodableBody for type bits no codec has."""
    if not sys_flag & sysflag.COMPRESSED:
        return Compression.NONE
    bits = sys_flag & sysflag.COMPRESSION_TYPE_MASK
    if bits == 0:
        return Compression.ZLIB
    kind = _BY_BITS.get(bits)
    if kind is None:
        raise UndecodableBody(
            f"unknown compression type bits {bits:#x} in sys flag {sys_flag:#x} "
            "(0x100 lz4, 0x200 zstd, 0x300 zlib)",
            field="sys_flag",
        )
    return kind


def decompress(body: bytes, sys_flag: int, limit_bytes: int) -> bytes:
    """The original body of a stored one (the body itself when not marked compressed), at most
    `limit_bytes` long; UndecodableBody when it does not decompress whole within that."""
    kind = compression_of(sys_flag)
    if kind is Compression.NONE:
        return body
    try:
        if kind is Compression.ZLIB:
            out = _zlib(body, limit_bytes)
        elif kind is Compression.LZ4:
            out = _lz4(body, limit_bytes)
        else:
            out = _zstd(body, limit_bytes)
        if len(out) > limit_bytes:
            raise _Short(f"decompresses past the {limit_bytes}-byte limit", len(out))
    except _Short as exc:
        why, made = str(exc), exc.output_bytes
    except Exception as exc:  # each library raises its own error type for bad input
        # (zstd's one error for a frame that needs more than the limit, and for a bad one)
        why, made = f"does not decompress within the {limit_bytes}-byte limit: {exc}", limit_bytes
    else:
        return out
    raise UndecodableBody(
        f"body marked {kind.value}-compressed (sys flag {sys_flag:#x}) {why}", output_bytes=made
    )


class _Short(ValueError):
    """Why a body's stream does not give its original (the end of a sentence), and how much
    output the attempt made."""

    def __init__(self, why: str, output_bytes: int) -> None:
        super().__init__(why)
        self.output_bytes = output_bytes


def _zlib(body: bytes, limit_bytes: int) -> bytes:
    d = zlib.decompressobj()
    out = d.decompress(body, limit_bytes + 1)
    if len(out) <= limit_bytes and not d.eof:
        raise _Short("is truncated: its stream has no end", len(out))
    return out


def _lz4(body: bytes, limit_bytes: int) -> bytes:
    d = lz4.frame.LZ4FrameDecompressor()
    out: bytes = d.decompress(body, max_length=limit_bytes + 1)
    if len(out) <= limit_bytes and not d.eof:
        raise _Short("is truncated: its frame has no end", len(out))
    return out


def _zstd(body: bytes, limit_bytes: int) -> bytes:
    declared = zstandard.frame_content_size(body)  # ZstdError for a bad frame header
    if declared > limit_bytes:
        raise _Short(f"declares {declared} bytes, past the {limit_bytes}-byte limit", 0)
    # Declared (<= the limit): the output is exactly that, or an error. Not declared (-1):
    # max_output_size bounds it, and a frame that needs more is an error.
    out: bytes = zstandard.ZstdDecompressor().decompress(body, max_output_size=limit_bytes)
    return out
