"""formats/compression.py: one reading of a stored body for the consumer and the store's
append check, bounded whatever the body claims."""

from __future__ import annotations

import time
import zlib

import pytest
import zstandard

from mqstore.formats import sysflag
from mqstore.formats.compression import Compression, UndecodableBody, compression_of, decompress

ZSTD = sysflag.COMPRESSED | sysflag.COMPRESSION_ZSTD
ZLIB = sysflag.COMPRESSED | sysflag.COMPRESSION_ZLIB


def zstd_frame_declaring(content_bytes: int) -> bytes:
    """A zstd frame whose header declares `content_bytes` (a real frame of that many zeros)."""
    return zstandard.ZstdCompressor().compress(bytes(content_bytes))


def test_a_zstd_frame_declaring_more_than_the_limit_is_refused_before_decompressing() -> None:
    """zstandard's one-shot decompress trusts a declared content size over max_output_size
    (it made all 64 MiB of this frame with a 4 MiB limit); the header is read first."""
    frame = zstd_frame_declaring(64 << 20)
    began = time.perf_counter()
    with pytest.raises(UndecodableBody, match="declares 67108864 bytes") as info:
        decompress(frame, ZSTD, 1 << 20)
    assert info.value.output_bytes == 0
    assert time.perf_counter() - began < 0.5  # nothing decompressed (64 MiB takes longer)


def test_the_limit_is_inclusive() -> None:
    assert decompress(zlib.compress(bytes(1000)), ZLIB, 1000) == bytes(1000)
    with pytest.raises(UndecodableBody, match="past the 999-byte limit") as info:
        decompress(zlib.compress(bytes(1000)), ZLIB, 999)
    assert info.value.output_bytes == 1000  # stopped one byte past it


def test_bytes_after_the_stream_are_ignored_as_rocketmqs_readers_ignore_them() -> None:
    assert decompress(zlib.compress(b"body") + b"trailer", ZLIB, 100) == b"body"


def test_a_body_not_marked_compressed_is_itself_whatever_its_type_bits() -> None:
    assert decompress(b"plain", sysflag.COMPRESSION_ZLIB, 1) == b"plain"
    assert compression_of(sysflag.COMPRESSION_ZSTD) is Compression.NONE


def test_unknown_type_bits_name_the_sys_flag() -> None:
    with pytest.raises(UndecodableBody) as info:
        decompress(b"x", sysflag.COMPRESSED | 0x600, 100)
    assert info.value.field == "sys_flag"
