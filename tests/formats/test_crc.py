"""The body CRC comes from ISA-L (formats/crc.py); it must be zlib's CRC-32 bit for bit, or no
record written before, or by RocketMQ, would read back."""

from __future__ import annotations

import mmap
import zlib

import crc32c
from hypothesis import given
from hypothesis import strategies as st

from mqstore.formats import _core
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


@given(st.binary(max_size=5_000), st.integers(0, 64), st.integers(0, 2**32 - 1))
def test_the_compiled_cores_crc_is_the_same(data: bytes, cut: int, start: int) -> None:
    """formats/_core.pyx's CRC-32 (zlib, 64-byte blocks folded with PCLMULQDQ where the CPU has
    it) gives crc.py's values, from any start value and at any alignment."""
    view = memoryview(data)[cut:]
    assert _core.crc32(view) == crc32(view)
    assert _core.crc32(view, start) == crc32(view, start) == zlib.crc32(view, start)


def test_the_compiled_crc_at_every_length_around_its_block_sizes() -> None:
    data = bytes(range(256)) * 40
    for length in [*range(200), 255, 256, 257, 1023, 1024, 1025, 4096 + 15]:
        for at in (0, 1, 3, 8, 15):
            piece = memoryview(data)[at : at + length]
            assert _core.crc32(piece) == crc32(piece), (length, at)
    big = bytes(range(256)) * 70_000
    assert _core.crc32(big) == crc32(big)
    with mmap.mmap(-1, 8192) as page:
        page[:100] = bytes(range(100))
        assert _core.crc32(page) == crc32(page)
    assert _core.crc32(b"") == 0


@given(st.binary(max_size=300), st.integers(0, 16))
def test_the_cores_crc32c_is_the_crc32c_packages_for_every_length_and_alignment(
    data: bytes, cut: int
) -> None:
    # The time entries' checks (cq_time.py) are cut from it: sliced by 8 in the core, so every
    # length mod 8 and every start offset is exercised, against the package's bytewise value.
    assert _core.crc32c(data) == crc32c.crc32c(data)
    view = memoryview(data)[cut:]
    assert _core.crc32c(view) == crc32c.crc32c(bytes(view))
