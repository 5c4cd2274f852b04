"""The body CRC comes from ISA-L (formats/crc.py); it must be zlib's CRC-32 bit for bit, or no
record written before, or by RocketMQ, would read back."""

from __future__ import annotations

import mmap
import zlib

from hypothesis import given
from hypothesis import strategies as st

from mqstore.formats.crc import crc32
from mqstore.formats.record import body_crc


@given(st.binary(max_size=5_000), st.integers(0, 64), st.integers(0, 64))
def test_the_crc_is_zlibs_for_bytes_and_for_slices_of_them(
    data: bytes, cut: int, trim: int
) -> None:
    assert crc32(data) == zlib.crc32(data)
    view = memoryview(data)[cut : max(cut, len(data) - trim)]
    assert crc32(view) == zlib.crc32(view)


def test_the_crc_of_a_mapped_page_and_of_large_and_empty_buffers() -> None:
    big = bytes(range(256)) * 70_000  # ~17 MiB: the vectorised path
    assert crc32(big) == zlib.crc32(big)
    assert crc32(b"") == zlib.crc32(b"") == 0
    with mmap.mmap(-1, 8192) as page:
        page[:11] = b"hello world"
        assert crc32(memoryview(page)[:11]) == zlib.crc32(b"hello world")


def test_a_body_crc_is_rocketmqs_positive_java_int() -> None:
    # RocketMQ's UtilAll.crc32(body) & 0x7FFFFFFF of a known body.
    assert body_crc(b"hello world") == zlib.crc32(b"hello world") & 0x7FFFFFFF == 222957957
